import CUbiq
import Foundation
import Logging
import UbiqFS
import UbiqState
import UbiqSync

/// A Unix socket in the state directory (mode 0600: its owner only) for what is not per
/// file: the mount's status, sync now, queries, versions, and event streams. One JSON request
/// a line (`ControlRequest`); each answer is a JSON line (docs/control.md).
public final class ControlServer: @unchecked Sendable {
    public let path: String
    let engine: Engine
    let info: MountInfo
    let logger: Logger
    let kv: KVMirror?
    private var fd: Int32 = -1
    var fs: FileSystem { engine.fs }

    public init(path: String, engine: Engine, kv: KVMirror?, info: MountInfo, logger: Logger) {
        self.path = path; self.engine = engine; self.kv = kv; self.info = info; self.logger = logger
    }

    public func start() throws {
        unlink(path)
        let s = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard s >= 0 else { throw ControlError("control socket: \(String(cString: strerror(errno)))") }
        var addr = try ControlConnection.address(path)
        // Made in a folder only its owner can enter (the state directory, or a runtime folder
        // of mode 0700), then made 0600. The process's umask is left alone: it is the whole
        // process's, and a child another thread forks meanwhile takes it (a test run's `cp -a`
        // made 0600 files, its `dpkg-deb` refused the package's folders).
        let r = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard r == 0, chmod(path, 0o600) == 0, listen(s, 16) == 0 else {
            close(s)
            throw ControlError("control socket \(path): \(String(cString: strerror(errno)))")
        }
        fd = s
        let t = Thread { [self] in acceptLoop(s) }
        t.name = "ubiq-control"
        t.start()
    }

    public func stop() {
        if fd >= 0 { shutdown(fd, Int32(SHUT_RDWR)); close(fd); fd = -1 }
        unlink(path)
    }

    private func acceptLoop(_ s: Int32) {
        while true {
            let c = accept(s, nil, nil)
            if c < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                return  // closed at unmount
            }
            _ = fcntl(c, F_SETFD, FD_CLOEXEC)
            // Its owner only (and root): the socket's mode says so too, but a directory or a
            // mode changed by hand must not open the mount's control to others.
            let peer = cubiq_peer_uid(c)
            if peer != Int64(getuid()) && peer != 0 {
                logger.warning("control socket: refused a connection from uid \(peer)")
                let t = Thread { Self.refuse(c) }
                t.name = "ubiq-control-refuse"
                t.start()
                continue
            }
            let t = Thread { [self] in
                serve(ControlConnection(fd: c))
            }
            t.name = "ubiq-control-conn"
            t.start()
        }
    }

    /// Answers a connection it will not serve, then waits (a second at most) for the client's
    /// request before closing: closed at once, the client's write of its request could fail
    /// with EPIPE before it reads why.
    private static func refuse(_ c: Int32) {
        let conn = ControlConnection(fd: c)
        _ = conn.send(Refusal(error: "this mount's control belongs to uid \(getuid())"))
        shutdown(c, Int32(SHUT_WR))
        var tv = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var buf = [UInt8](repeating: 0, count: 4096)
        var drained = 0
        while drained < 1 << 16 {
            let n = read(c, &buf, buf.count)
            if n <= 0 { break }
            drained += n
        }
        conn.close()
    }

    /// Answers requests, a line each, until the client closes (or a stream ends).
    private func serve(_ conn: ControlConnection) {
        defer { conn.close() }
        while let line = conn.nextLine(limit: 1 << 20) {
            let req: ControlRequest
            do {
                req = try JSONDecoder().decode(ControlRequest.self, from: Data(line.utf8))
            } catch let e as ControlError {
                _ = conn.send(Refusal(error: e.description))
                continue
            } catch let e as DecodingError {
                // An op this version knows, with fields it cannot read: say which, and go on.
                struct Op: Decodable { var op: String }
                guard let op = try? JSONDecoder().decode(Op.self, from: Data(line.utf8)).op else {
                    _ = conn.send(Refusal(error: "expected one JSON object with an \"op\""))
                    return
                }
                _ = conn.send(Refusal(error: "\(op): \(e)"))
                continue
            } catch {
                _ = conn.send(Refusal(error: "expected one JSON object with an \"op\""))
                return
            }
            if !handle(conn, req) { return }
        }
    }

    /// Handles one request; false when the connection is done (a stream ended).
    private func handle(_ conn: ControlConnection, _ req: ControlRequest) -> Bool {
        do {
            if req.op.hasPrefix("kv-") && kv == nil {
                throw ControlError("this mount shows a container's Documents only; its key-value store is reached through a mount of the whole container (--scope all), or with --store and --container")
            }
            switch req {
            case .status:
                try fs.commitPendingCreates()  // (so that pendingUploads counts new files)
                let look = engine.feed.look
                return conn.send(StatusReply(
                    mount: info.mount, store: info.store, device: info.device, deviceName: info.deviceName, state: info.state,
                    cacheLimit: String(info.cacheLimit), pid: String(info.pid), items: fs.inodeCount,
                    cacheBytes: fs.localContentBytes, pendingUploads: engine.uploader.pendingCount,
                    lastPoll: look.polled.map { ISO8601DateFormatter().string(from: $0) }, lastPollError: look.error))
            case .pause(let seconds):
                try engine.pause.pause(for: seconds)
                return conn.send(Done())
            case .resume:
                try engine.pause.resume()
                if let kv { DispatchQueue.global().async { kv.pushPending() } }
                engine.uploader.kick()
                engine.feed.kick()
                return conn.send(Done())
            case .sync(let full, let wait):
                try fs.commitPendingCreates()
                // What failed, said as the attribute's EIO is (`ubiq sync`: "cannot sync
                // PATH: the store could not be reached: …"), not as an I/O error of the mount.
                do {
                    try fs.syncWithStore(everywhere: full, flushing: wait)
                } catch FSError.io(let why) {
                    return conn.send(Refusal(error: why))
                }
                return conn.send(Done())
            case .query(let scope, let spec, let lines):
                // Rows come inside the state database's read, which every request waits
                // for: the text goes out as the socket takes it, never waiting for the reader.
                // (Once part of it went, a failure can only close the connection.)
                var reply = QueryText(lines: lines)
                var sent = false, gone = false
                do {
                    try fs.query(scope: scope, spec) { r in
                        reply.append(r)
                        if reply.text.count > 1 << 20 {
                            sent = true
                            gone = !conn.sendSome(&reply.text)
                        }
                        return !gone
                    }
                } catch {
                    if sent { return false }
                    throw error
                }
                return !gone && conn.sendRaw(reply.finished())
            case .history(let path):
                let (key, all) = try engine.history(at: path)
                return conn.send(HistoryReply(storeKey: key, versions: all.map { v in
                    HistoryReply.Version(version: v.version, size: v.size, mtimeNs: v.metadata.mtimeNs,
                                         device: v.metadata.device ?? "", current: v.version == all.first?.version)
                }))
            case .restore(let path, let version):
                return conn.send(RestoreReply(version: try engine.restore(path: path, version: version)))
            case .watch(let scope):
                return watch(conn, scope: scope.split(separator: "/").joined(separator: "/"))
            case .kvGet(let key):
                return conn.send(KVGetReply(result: try kv!.get(key)))
            case .kvList:
                return conn.send(KVListReply(values: try kv!.list()))
            case .kvSet(var entry):
                entry.device = kv!.client.device
                let stands = try kv!.set(entry)
                return conn.send(KVSetReply(stands: stands, won: stands == entry))
            case .kvWatch:
                return kvWatch(conn)
            }
        } catch {
            return conn.send(Refusal(error: "\(error)"))
        }
    }

    private func watch(_ conn: ControlConnection, scope: String) -> Bool {
        do { _ = try fs.folder(at: scope) } catch { return conn.send(Refusal(error: "\(error)")) }
        let sub = fs.events.subscribe()
        defer { fs.events.unsubscribe(sub) }
        guard conn.send(Done()) else { return false }
        let iso = ISO8601DateFormatter()
        iso.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        while true {
            guard let (events, dropped) = sub.next(timeout: 5) else { return false }
            if dropped > 0, !conn.send(WatchEvent(event: "overflow", dropped: dropped)) { return false }
            for e in events where scope.isEmpty || e.path == scope || e.path.hasPrefix(scope + "/")
                || (e.from.map { $0 == scope || $0.hasPrefix(scope + "/") } ?? false) {
                let (path, rawPath) = PathText.of(e.pathBytes)
                let from = e.fromBytes.map(PathText.of)
                let copy = e.copyBytes.map(PathText.of)
                if !conn.send(WatchEvent(event: e.kind.rawValue, path: path, rawPath: rawPath, from: from?.0, rawFrom: from?.1,
                                         copy: copy?.0, rawCopy: copy?.1, time: iso.string(from: e.time))) {
                    return false
                }
            }
            // A reader that went away is noticed at the next write; poke it now and then.
            if events.isEmpty && !conn.alive { return false }
        }
    }

    private func kvWatch(_ conn: ControlConnection) -> Bool {
        let id = kv!.subscribe()
        defer { kv!.unsubscribe(id) }
        guard conn.send(Done()) else { return false }
        while true {
            let changes = kv!.next(id, timeout: 5)
            for ch in changes {
                if !conn.send(KVChange(reason: ch.reason, keys: ch.entries.map(\.key), entries: ch.entries)) { return false }
            }
            if changes.isEmpty && !conn.alive { return false }
        }
    }
}

/// The answer to a query (`QueryReply`) as text, a row at a time: written by hand, as
/// JSONEncoder takes a second for 100,000 rows, and as the rows come (no array of them).
struct QueryText {
    /// A row a line (`{"ok":true}` first, `{"count":N,"end":true}` last), or all in one answer
    /// (`QueryReply`).
    let lines: Bool
    /// What is written and not sent yet.
    var text: [UInt8]
    private var count = 0

    init(lines: Bool) {
        self.lines = lines
        text = Array((lines ? "{\"ok\":true}\n" : "{\"ok\":true,\"items\":[").utf8)
    }

    /// Written byte by byte into `text` (built as strings first, the rows' text was 40% of the
    /// daemon's time for a query of a million items).
    mutating func append(_ r: QueryRow) {
        if !lines && count > 0 { text.append(UInt8(ascii: ",")) }
        count += 1
        put("{\"ino\":"); put(r.ino)
        put(",\"path\":"); appendJSONString(r.path, to: &text)
        put(",\"name\":"); appendJSONString(r.name, to: &text)
        if let raw = r.rawPath {
            put(",\"rawPath\":[")
            for (i, b) in raw.enumerated() {
                if i > 0 { text.append(UInt8(ascii: ",")) }
                put(b)
            }
            put("]")
        }
        put(",\"depth\":"); put(r.depth)
        put(",\"type\":"); appendJSONString(r.type, to: &text)
        put(",\"size\":"); put(r.size)
        put(",\"mtimeNs\":"); put(r.mtimeNs)
        put(",\"status\":\""); text.append(contentsOf: r.status.rawValue.utf8)
        put(r.pinned ? "\",\"pinned\":true}" : "\",\"pinned\":false}")
        if lines { text.append(UInt8(ascii: "\n")) }
    }

    private mutating func put(_ s: StaticString) {
        s.withUTF8Buffer { text.append(contentsOf: $0) }
    }

    private mutating func put(_ n: some BinaryInteger) {
        text.append(contentsOf: String(n).utf8)
    }

    mutating func finished() -> [UInt8] {
        text.append(contentsOf: (lines ? "{\"count\":\(count),\"end\":true}\n" : "]}\n").utf8)
        return text
    }
}
