import CUbiq
import Foundation
import Logging
import UbiqFS
import UbiqState
import UbiqStore
import UbiqSync

/// A Unix socket in the state directory (mode 0600: its owner only) for what is not per
/// file: the mount's status, sync now, queries, and event streams. One JSON request line
/// per connection; the answer is JSON lines (docs/control.md).
final class ControlServer: @unchecked Sendable {
    let path: String
    let fs: FileSystem
    let feed: ChangeFeed
    let uploader: Uploader
    let info: [String: String]
    let logger: Logger
    let kv: KVMirror?
    private var fd: Int32 = -1

    init(path: String, fs: FileSystem, feed: ChangeFeed, uploader: Uploader, kv: KVMirror?, info: [String: String], logger: Logger) {
        self.path = path; self.fs = fs; self.feed = feed; self.uploader = uploader; self.kv = kv; self.info = info; self.logger = logger
    }

    static func kvDoc(_ e: KVEntry) -> Any { (try? JSONSerialization.jsonObject(with: e.encoded())) ?? NSNull() }

    func start() throws {
        unlink(path)
        let s = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard s >= 0 else { throw UserError("control socket: \(String(cString: strerror(errno)))") }
        var addr = try Self.address(path)
        let old = umask(0o177)  // created 0600
        let r = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        umask(old)
        guard r == 0, chmod(path, 0o600) == 0, listen(s, 16) == 0 else {
            close(s)
            throw UserError("control socket \(path): \(String(cString: strerror(errno)))")
        }
        fd = s
        let t = Thread { [self] in acceptLoop(s) }
        t.name = "ubiq-control"
        t.start()
    }

    func stop() {
        if fd >= 0 { shutdown(fd, Int32(SHUT_RDWR)); close(fd); fd = -1 }
        unlink(path)
    }

    static func address(_ path: String) throws -> sockaddr_un {
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { throw UserError("socket path too long: \(path)") }
        withUnsafeMutableBytes(of: &addr.sun_path) { buf in
            for (i, b) in bytes.enumerated() { buf[i] = b }
            buf[bytes.count] = 0
        }
        return addr
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
                serve(c)
                close(c)
            }
            t.name = "ubiq-control-conn"
            t.start()
        }
    }

    /// Answers a connection it will not serve, then waits (a second at most) for the client's
    /// request before closing: closed at once, the client's write of its request could fail
    /// with EPIPE before it reads why.
    private static func refuse(_ c: Int32) {
        _ = send(c, ["ok": false, "error": "this mount's control belongs to uid \(getuid())"])
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
        close(c)
    }

    /// Answers requests, a line each, until the client closes (or a stream ends).
    private func serve(_ c: Int32) {
        let reader = LineReader(c)
        while let line = reader.next(limit: 1 << 20) {
            guard let req = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                  let op = req["op"] as? String else {
                _ = Self.send(c, ["ok": false, "error": "expected one JSON object with an \"op\""])
                return
            }
            if !handle(c, op, req) { return }
        }
    }

    /// Handles one request; false when the connection is done (a stream ended).
    private func handle(_ c: Int32, _ op: String, _ req: [String: Any]) -> Bool {
        do {
            switch op {
            case "status":
                try fs.commitPendingCreates()  // (so that pendingUploads counts new files)
                var o: [String: Any] = ["ok": true, "items": fs.inodeCount, "cacheBytes": fs.localContentBytes,
                                        "pendingUploads": uploader.pendingCount]
                for (k, v) in info { o[k] = v }
                if let p = feed.lastPollOutcome {
                    o["lastPoll"] = ISO8601DateFormatter().string(from: p.at)
                    if let e = p.error { o["lastPollError"] = e }
                }
                _ = Self.send(c, o)
            case "sync":
                try fs.commitPendingCreates()
                try feed.poll()
                uploader.kick()
                _ = Self.send(c, ["ok": true])
            case "query":
                let spec = try JSONDecoder().decode(QuerySpec.self, from: JSONSerialization.data(withJSONObject: req["spec"] ?? [:]))
                let rows = try fs.query(scope: req["scope"] as? String ?? "", spec)
                // Written by hand: JSONEncoder takes a second for 100,000 rows.
                var out = "{\"ok\":true,\"items\":["
                out.reserveCapacity(rows.count * 160)
                for (i, r) in rows.enumerated() {
                    if i > 0 { out += "," }
                    out += "{\"ino\":\(r.ino),\"path\":" + jsonString(r.path) + ",\"name\":" + jsonString(r.name)
                    out += ",\"depth\":\(r.depth),\"type\":\"\(r.type)\",\"size\":\(r.size),\"mtimeNs\":\(r.mtimeNs)"
                    out += ",\"status\":\"\(r.status.rawValue)\",\"pinned\":\(r.pinned)}"
                }
                out += "]}\n"
                if !Self.sendRaw(c, out) { return false }
            case "history":
                let item = try storeItem(at: req["path"] as? String ?? "")
                let all = try uploader.history(of: item.key)
                let list: [[String: Any]] = all.map { v in
                    ["version": v.version, "size": v.size, "mtimeNs": v.metadata.mtimeNs, "device": v.metadata.device ?? "",
                     "current": v.version == all.first?.version]
                }
                _ = Self.send(c, ["ok": true, "storeKey": item.key, "versions": list])
            case "restore":
                let version = try restore(path: req["path"] as? String ?? "", version: req["version"] as? String ?? "")
                _ = Self.send(c, ["ok": true, "version": version])
            case "watch":
                let scope = (req["scope"] as? String ?? "").split(separator: "/").joined(separator: "/")
                _ = try fs.folder(at: scope)
                let sub = fs.events.subscribe()
                defer { fs.events.unsubscribe(sub) }
                guard Self.send(c, ["ok": true]) else { return false }
                let iso = ISO8601DateFormatter()
                iso.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
                while true {
                    guard let (events, dropped) = sub.next(timeout: 5) else { return false }
                    if dropped > 0, !Self.send(c, ["event": "overflow", "dropped": dropped]) { return false }
                    for e in events where scope.isEmpty || e.path == scope || e.path.hasPrefix(scope + "/")
                        || (e.from.map { $0 == scope || $0.hasPrefix(scope + "/") } ?? false) {
                        var o: [String: Any] = ["event": e.kind.rawValue, "path": e.path, "time": iso.string(from: e.time)]
                        if let f = e.from { o["from"] = f }
                        if !Self.send(c, o) { return false }
                    }
                    // A reader that went away is noticed at the next write; poke it now and then.
                    if events.isEmpty && !Self.alive(c) { return false }
                }
            case _ where op.hasPrefix("kv-") && kv == nil:
                _ = Self.send(c, ["ok": false, "error": "this mount shows a container's Documents only; its key-value store is reached through a mount of the whole container (--scope all), or with --store and --container"])
            case "kv-get":
                let e = try kv!.get(req["key"] as? String ?? "")
                _ = Self.send(c, ["ok": true, "result": e.map(Self.kvDoc) ?? NSNull()])  // keys after "ok": the answer starts {"ok":true
            case "kv-list":
                _ = Self.send(c, ["ok": true, "values": try kv!.list().map(Self.kvDoc)])
            case "kv-set":
                guard let doc = req["entry"], let data = try? JSONSerialization.data(withJSONObject: doc),
                      var e = KVEntry.decode(data) else { throw KVError("kv-set needs an entry") }
                e.device = kv!.client.device
                let stands = try kv!.set(e)
                _ = Self.send(c, ["ok": true, "stands": Self.kvDoc(stands), "won": stands == e])
            case "kv-watch":
                let id = kv!.subscribe()
                defer { kv!.unsubscribe(id) }
                guard Self.send(c, ["ok": true]) else { return false }
                while true {
                    let changes = kv!.next(id, timeout: 5)
                    for ch in changes {
                        let o: [String: Any] = ["reason": ch.reason, "keys": ch.entries.map(\.key), "entries": ch.entries.map(Self.kvDoc)]
                        if !Self.send(c, o) { return false }
                    }
                    if changes.isEmpty && !Self.alive(c) { return false }
                }
            default:
                _ = Self.send(c, ["ok": false, "error": "unknown op \(op)"])
            }
        } catch {
            return Self.send(c, ["ok": false, "error": "\(error)"])
        }
        return true
    }

    /// `ubiq restore`: writes a prior version of the item at `path` as its newest version
    /// (in the store: nothing is downloaded), then brings that here. Returns the new version.
    /// The item at `path` in the store; one clear line when it has never been uploaded.
    private func storeItem(at path: String) throws -> (key: String, version: String, changedHere: Bool) {
        do { return try fs.storeItem(at: path) } catch FSError.notUploaded {
            throw UserError("\(path) is not in the store yet: it has versions there once its first upload is done")
        }
    }

    private func restore(path: String, version: String) throws -> String {
        let item = try storeItem(at: path)
        if item.changedHere {
            throw UserError("\(path) has changes here that are not in the store yet; try again once they are uploaded")
        }
        let made: String?
        do {
            made = try uploader.restore(key: item.key, version: version, over: item.version)
        } catch StoreError.preconditionFailed {
            throw UserError("\(path) changed in the store meanwhile; run ubiq sync and try again")
        }
        guard let made else { throw UserError("\(path) has no version \(version) (ubiq versions --all lists them)") }
        try feed.poll()
        return made
    }

    @discardableResult
    static func send(_ c: Int32, _ object: [String: Any]) -> Bool {
        guard let d = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]) else {
            return false
        }
        return sendRaw(c, String(decoding: d, as: UTF8.self) + "\n")
    }

    static func sendRaw(_ c: Int32, _ text: String) -> Bool {
        let bytes = Array(text.utf8)
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(c, $0.baseAddress! + done, bytes.count - done, Int32(MSG_NOSIGNAL)) }
            if n < 0 { if errno == EINTR { continue }; return false }
            done += n
        }
        return true
    }

    /// False once the other end has closed.
    static func alive(_ c: Int32) -> Bool {
        var p = pollfd(fd: c, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, 0) >= 0 else { return false }
        if p.revents & Int16(POLLHUP | POLLERR) != 0 { return false }
        if p.revents & Int16(POLLIN) != 0 {
            var b: UInt8 = 0
            return recv(c, &b, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) != 0
        }
        return true
    }
}

/// Reads lines from a socket, a buffer at a time.
final class LineReader {
    let fd: Int32
    private var buffer: [UInt8] = []
    private var start = 0
    /// Where the search for the next newline goes on (what is before it has none).
    private var scanned = 0
    init(_ fd: Int32) { self.fd = fd }

    func next(limit: Int) -> String? {
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
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
            let n = read(fd, &chunk, chunk.count)
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
}

/// The CLI's end of the control socket.
struct ControlClient {
    let mount: String
    let socketPath: String
    private let fd: Int32
    private let reader: LineReader

    init(mount: String, socketPath: String, fd: Int32) {
        self.mount = mount; self.socketPath = socketPath; self.fd = fd; reader = LineReader(fd)
    }

    /// Connects to the daemon of the mount that `path` is in; fails with one clear line.
    static func connect(for path: String) -> ControlClient {
        let abs = Paths.absolute(path)
        guard FileManager.default.fileExists(atPath: abs) else { fail("\(path): no such file or directory") }
        guard let mount = Mounts.ubiqMount(containing: abs) else { fail("\(path) is not in a ubiq mount") }
        guard let sock = getAttribute(mount, "user.ubiq.control-socket"), !sock.isEmpty else {
            fail("the daemon of \(mount) does not answer (is it still running?)")
        }
        let s = dial(sock)
        if s < 0 { fail("cannot reach the daemon of \(mount) at \(sock): \(String(cString: strerror(-s)))") }
        return ControlClient(mount: mount, socketPath: sock, fd: s)
    }

    /// The daemon of the ubiq mount point `mount`, or nil when it does not answer.
    static func reach(mount: String) -> ControlClient? {
        guard let sock = getAttribute(mount, "user.ubiq.control-socket"), !sock.isEmpty else { return nil }
        let s = dial(sock)
        return s < 0 ? nil : ControlClient(mount: mount, socketPath: sock, fd: s)
    }

    /// A connected socket to `path`, or -errno.
    private static func dial(_ path: String) -> Int32 {
        let s = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        if s < 0 { return -errno }
        guard var addr = try? ControlServer.address(path) else { Glibc.close(s); return -ENAMETOOLONG }
        let r = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(s, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if r != 0 { let e = errno; Glibc.close(s); return -e }
        return s
    }

    /// The path of `abs` below the mount ("" for the mount itself).
    func relative(_ abs: String) -> String {
        abs == mount ? "" : String(abs.dropFirst(mount == "/" ? 1 : mount.count + 1))
    }

    func request(_ object: [String: Any]) -> [String: Any] {
        guard let reply = try? JSONSerialization.jsonObject(with: Data(requestRaw(object).utf8)) as? [String: Any] else {
            fail("the daemon of \(mount) sent an answer that is not JSON")
        }
        return reply
    }

    /// Sends a request; returns its answer line as it came (after checking it says ok).
    func requestRaw(_ object: [String: Any]) -> String {
        guard ControlServer.send(fd, object) else { fail("the daemon of \(mount) closed the connection") }
        guard let line = reader.next(limit: 1 << 30) else { fail("the daemon of \(mount) closed the connection") }
        if !line.hasPrefix("{\"ok\":true") {
            let reply = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            fail(reply?["error"] as? String ?? "the daemon refused the request")
        }
        return line
    }

    /// Sends a request; its answer, or nil when the daemon closed the connection or refused.
    func ask(_ object: [String: Any]) -> [String: Any]? {
        guard ControlServer.send(fd, object), let reply = nextLine(), reply["ok"] as? Bool == true else { return nil }
        return reply
    }

    /// The next line of a stream (nil when the daemon closed it).
    func nextLine() -> [String: Any]? {
        guard let line = reader.next(limit: 1 << 20) else { return nil }
        return try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
    }

    func close() { Glibc.close(fd) }
}
