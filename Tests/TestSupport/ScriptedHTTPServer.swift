import Foundation
import Glibc

/// An HTTP/1.1 server on 127.0.0.1 that gives scripted answers, one a request, in order, on a
/// connection each (`Connection: close`): for answers no real service gives on demand (a
/// server contradicting itself under load). It reads a request's head only (GETs and HEADs).
public final class ScriptedHTTPServer: @unchecked Sendable {
    public struct Answer: Sendable {
        public var status: Int
        public var headers: [(String, String)]
        public var body: Data
        /// What `Content-Length` says (nil: the body's length).
        public var claimedLength: Int?

        public init(_ status: Int, headers: [(String, String)] = [], body: Data = Data(), claimedLength: Int? = nil) {
            self.status = status; self.headers = headers; self.body = body; self.claimedLength = claimedLength
        }
    }

    public let port: Int
    public var endpoint: URL { URL(string: "http://127.0.0.1:\(port)")! }
    private let lock = NSLock()
    private var answers: [Answer]
    private var heads: [String] = []

    /// Each request's head (request line and headers), in the order they came.
    public var requests: [String] { lock.withLock { heads } }

    public init(_ answers: [Answer]) throws {
        self.answers = answers
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EIO) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        let bound = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0, listen(fd, 16) == 0 else { close(fd); throw POSIXError(.EADDRINUSE) }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        port = Int(UInt16(bigEndian: addr.sin_port))
        socketState = Listening(fd)
        let listening = socketState
        // The thread closes the listening socket; `stop` only shuts it down (which ends the
        // thread's `accept`) while it is open: a number closed and used again could be another
        // test's socket.
        Thread { [weak self] in
            defer { listening.close() }
            while true {
                let c = accept(listening.fd, nil, nil)
                if c < 0 {
                    if errno == EINTR || errno == ECONNABORTED { continue }
                    return
                }
                guard let self else { close(c); return }
                self.serve(c)
            }
        }.start()
    }

    /// The listening socket, closed once.
    private final class Listening: @unchecked Sendable {
        let fd: Int32
        private let lock = NSLock()
        private var open = true
        init(_ fd: Int32) { self.fd = fd }
        func shutDown() { lock.withLock { if open { shutdown(fd, Int32(SHUT_RDWR)) } } }
        func close() { lock.withLock { if open { open = false; Glibc.close(fd) } } }
    }
    private let socketState: Listening

    /// Stops listening: the thread's `accept` ends and it closes the socket.
    public func stop() { socketState.shutDown() }

    deinit { stop() }

    private func serve(_ c: Int32) {
        defer { close(c) }
        var head = Data()
        var byte: UInt8 = 0
        while !head.ends(with: "\r\n\r\n"), read(c, &byte, 1) == 1 { head.append(byte) }
        let answer: Answer? = lock.withLock {
            heads.append(String(decoding: head, as: UTF8.self))
            return answers.isEmpty ? nil : answers.removeFirst()
        }
        let a = answer ?? Answer(500, body: Data("<Error><Code>InternalError</Code></Error>".utf8))
        var text = "HTTP/1.1 \(a.status) Scripted\r\nConnection: close\r\nContent-Length: \(a.claimedLength ?? a.body.count)\r\n"
        for (k, v) in a.headers { text += "\(k): \(v)\r\n" }
        var out = Data((text + "\r\n").utf8)
        if !head.starts(with: Data("HEAD ".utf8)) { out.append(a.body) }
        out.withUnsafeBytes { p in
            var sent = 0
            while sent < p.count {
                let n = write(c, p.baseAddress! + sent, p.count - sent)
                if n <= 0 { return }
                sent += n
            }
        }
    }
}

private extension Data {
    func ends(with s: String) -> Bool { count >= s.utf8.count && suffix(s.utf8.count).elementsEqual(s.utf8) }
}
