import Foundation
import UbiqState
import UbiqStore
import UbiqSync

/// One end of a control socket connection: JSON lines in both directions. The daemon's server
/// answers on one; the CLI and the tests ask on one (`ControlConnection.dial`, `request`).
public final class ControlConnection: @unchecked Sendable {
    public let fd: Int32
    private var buffer: [UInt8] = []
    private var start = 0
    /// Where the search for the next newline goes on (what is before it has none).
    private var scanned = 0
    /// What a read takes (one for the connection: a query's rows are a line each).
    private var chunk = [UInt8](repeating: 0, count: 1 << 16)

    public init(fd: Int32) { self.fd = fd }

    /// Connects to the socket at `path`.
    public static func dial(_ path: String) throws -> ControlConnection {
        let s = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        if s < 0 { throw ControlError(String(cString: strerror(errno))) }
        var addr: sockaddr_un
        do { addr = try address(path) } catch { Glibc.close(s); throw error }
        let r = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(s, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if r != 0 { let e = errno; Glibc.close(s); throw ControlError(String(cString: strerror(e))) }
        return ControlConnection(fd: s)
    }

    static func address(_ path: String) throws -> sockaddr_un {
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { throw ControlError("socket path too long: \(path)") }
        withUnsafeMutableBytes(of: &addr.sun_path) { buf in
            for (i, b) in bytes.enumerated() { buf[i] = b }
            buf[bytes.count] = 0
        }
        return addr
    }

    /// Sends `request` and reads its answer: `T`, or the daemon's refusal thrown as a
    /// `ControlError`.
    public func request<T: Decodable>(_ request: ControlRequest, as: T.Type = T.self) throws -> T {
        guard send(request) else { throw ControlError("the daemon closed the connection") }
        return try answer(T.self)
    }

    /// The rows of a query under the folder `scope`, handed to `each` as they come (a row a
    /// line: neither end holds them all; a million rows were hundreds of MB in the CLI, and
    /// decoding them in one JSON answer two thirds of its time). A daemon from before rows
    /// came as lines answers with all of them at once, which is taken as well.
    public func query(scope: String, spec: QuerySpec, each: (QueryRow) throws -> Void) throws {
        guard send(ControlRequest.query(scope: scope, spec: spec, lines: true)) else {
            throw ControlError("the daemon closed the connection")
        }
        if let all = try answer(QueryHead.self).items {
            try all.forEach(each)
            return
        }
        while true {
            guard var line = nextLine(limit: 1 << 24) else { throw ControlError("the daemon closed the connection before the query's last row") }
            let object = line.withUTF8 { PlainJSON.parse($0) }?.object
            if let object, let row = QueryRow.plain(object) {
                try each(row)
            } else if object?["end"] == .bool(true) {
                return
            } else {
                try each(Self.decode(QueryRow.self, line))
            }
        }
    }

    /// The first line of a query's answer: `{"ok":true}` before rows that come as lines; all
    /// of them in `items` from a daemon that does not send lines.
    private struct QueryHead: Decodable { var items: [QueryRow]? }

    /// Reads the next line as `T` (an answer, or a line of a stream); nil when the daemon
    /// closed the connection.
    public func next<T: Decodable>(_ type: T.Type, limit: Int = 1 << 30) throws -> T? {
        guard let line = nextLine(limit: limit) else { return nil }
        return try Self.decode(T.self, line)
    }

    private func answer<T: Decodable>(_ type: T.Type) throws -> T {
        guard let reply = try next(Answer<T>.self) else { throw ControlError("the daemon closed the connection") }
        switch reply {
        case .ok(let value): return value
        case .refused(let why): throw ControlError(why)
        }
    }

    static func decode<T: Decodable>(_ type: T.Type, _ line: String) throws -> T {
        do { return try JSONDecoder().decode(T.self, from: Data(line.utf8)) } catch {
            throw ControlError("the daemon sent an answer this version cannot read (\(error))")
        }
    }

    /// An answer: `T` when it says `"ok": true`, else its `error` (one decoding of the line).
    enum Answer<T: Decodable>: Decodable {
        case ok(T)
        case refused(String)
        private enum Keys: String, CodingKey { case ok, error }
        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: Keys.self)
            if try c.decodeIfPresent(Bool.self, forKey: .ok) == true {
                self = .ok(try T(from: decoder))
            } else {
                self = .refused(try c.decodeIfPresent(String.self, forKey: .error) ?? "the daemon refused the request")
            }
        }
    }

    @discardableResult
    public func send<T: Encodable>(_ value: T) -> Bool {
        guard let line = jsonText(value) else { return false }
        return sendRaw(line + "\n")
    }

    /// Sends `text` as it is.
    public func sendRaw(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { send(bytes: $0, wait: true) } != nil
    }

    /// Sends `bytes` as they are.
    public func sendRaw(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBufferPointer { send(bytes: $0, wait: true) } != nil
    }

    /// Sends what of `bytes` the socket takes now, without waiting, and drops it from them;
    /// false once the other end is gone.
    public func sendSome(_ bytes: inout [UInt8]) -> Bool {
        guard let n = bytes.withUnsafeBufferPointer({ send(bytes: $0, wait: false) }) else { return false }
        bytes.removeFirst(n)
        return true
    }

    /// Sends `bytes`, all of them or (not `wait`) what the socket takes now: how many went
    /// (nil: the connection failed).
    private func send(bytes: UnsafeBufferPointer<UInt8>, wait: Bool) -> Int? {
        var done = 0
        while done < bytes.count {
            let n = Glibc.send(fd, bytes.baseAddress! + done, bytes.count - done, Int32(MSG_NOSIGNAL) | (wait ? 0 : Int32(MSG_DONTWAIT)))
            if n < 0 {
                if errno == EINTR { continue }
                if !wait && (errno == EAGAIN || errno == EWOULDBLOCK) { break }
                return nil
            }
            done += n
        }
        return done
    }

    /// The next line, without its newline (nil at the end, or past `limit` bytes).
    public func nextLine(limit: Int) -> String? {
        while true {
            if let nl = buffer[max(start, scanned)...].firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[start ..< nl], as: UTF8.self)
                start = nl + 1
                scanned = start
                if start > 1 << 20 { buffer.removeFirst(start); start = 0; scanned = 0 }
                return line
            }
            scanned = buffer.count
            if buffer.count - start > limit { return nil }
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 {
                if buffer.count > start {
                    defer { buffer.removeAll(); start = 0; scanned = 0 }
                    return String(decoding: buffer[start...], as: UTF8.self)
                }
                return nil
            }
            buffer.append(contentsOf: chunk[..<n])
        }
    }

    /// False once the other end has closed.
    public var alive: Bool {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, 0) >= 0 else { return false }
        if p.revents & Int16(POLLHUP | POLLERR) != 0 { return false }
        if p.revents & Int16(POLLIN) != 0 {
            var b: UInt8 = 0
            return recv(fd, &b, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) != 0
        }
        return true
    }

    public func close() { Glibc.close(fd) }
}

/// A JSON string literal for `s`.
public func jsonString(_ s: String) -> String {
    var out: [UInt8] = []
    appendJSONString(s, to: &out)
    return String(decoding: out, as: UTF8.self)
}

/// `jsonString(s)`'s bytes, added to `out` (a query's million rows are written so, byte by byte).
public func appendJSONString(_ s: String, to out: inout [UInt8]) {
    let hex = Array("0123456789abcdef".utf8)
    out.append(UInt8(ascii: "\""))
    for b in s.utf8 {
        switch b {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"): out.append(UInt8(ascii: "\\")); out.append(b)
        case 0x0A: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "n"))
        case 0x0D: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "r"))
        case 0x09: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "t"))
        case ..<0x20: out.append(contentsOf: Array("\\u00".utf8) + [hex[Int(b >> 4)], hex[Int(b & 15)]])
        default: out.append(b)
        }
    }
    out.append(UInt8(ascii: "\""))
}

