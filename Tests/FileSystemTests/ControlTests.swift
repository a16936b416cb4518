import Foundation
import Logging
import Testing
import TestSupport
import UbiqControl
@testable import UbiqFS
import UbiqState
import UbiqStore
import UbiqSync

/// The control socket without a mount: its typed requests on the wire, and a real server on a
/// Unix socket in front of a device, asked what `ubiq status`, `query`, `sync`, `versions`,
/// `restore`, `watch` and `kv` ask.
@Suite struct ControlTests {
    /// A device's control server on a socket of its own, and a connection to it.
    final class Served {
        let device: Device
        let server: ControlServer
        let kv: KVMirror

        init(_ device: Device, store: DirectoryStore, withKV: Bool = true) throws {
            self.device = device
            kv = KVMirror(state: device.state, client: KVStoreClient(store: store, device: "dev-a"), logger: device.logger)
            kv.pause = device.engine.pause  // as the daemon's
            server = ControlServer(path: device.dir.appendingPathComponent("control.sock").path, engine: device.engine,
                                   kv: withKV ? kv : nil,
                                   info: MountInfo(mount: "/mnt/test", store: "dir:/store", device: "dev-a", deviceName: "host-a",
                                                   state: device.dir.path, cacheLimit: 1 << 30, pid: getpid()),
                                   logger: device.logger)
            try server.start()
        }

        func connect() throws -> ControlConnection { try ControlConnection.dial(server.path) }
        deinit { server.stop() }
    }

    static func roundTrip(_ r: ControlRequest) throws -> ControlRequest {
        try JSONDecoder().decode(ControlRequest.self, from: JSONEncoder().encode(r))
    }

    @Test func everyRequestKeepsItsWireForm() throws {
        var spec = QuerySpec()
        spec.name = "*.txt"
        spec.status = [.uploading, .local]
        spec.limit = 5
        let all: [ControlRequest] = [
            .status, .sync(full: false, wait: false), .sync(full: true, wait: true), .query(scope: "a/b", spec: spec),
            .query(scope: "a/b", spec: spec, lines: true), .history(path: "a/b.txt"),
            .restore(path: "a/b.txt", version: "v1"), .watch(scope: ""), .kvGet(key: "k"), .kvList,
            .kvSet(entry: KVEntry(key: "k", value: .json("{\"a\":[true,null],\"b\":1.5}"), timeNs: 7, device: "d")),
            .kvSet(entry: KVEntry(key: "k", value: nil, timeNs: 8, device: "d")),
            .kvSet(entry: KVEntry(key: "k", value: .bytes(Data([0, 255, 7])), timeNs: 9, device: "d")),
            .kvWatch, .pause(seconds: nil), .pause(seconds: 7200), .resume,
        ]
        for r in all { #expect(try Self.roundTrip(r) == r) }
        // The forms docs/control.md shows (and `socat` users type) decode as these requests.
        let documented: [(String, ControlRequest)] = [
            (#"{"op":"status"}"#, .status),
            (#"{"op":"sync"}"#, .sync(full: false, wait: false)),
            (#"{"op":"sync","full":true,"wait":true}"#, .sync(full: true, wait: true)),
            (#"{"op":"query","scope":"a/b","spec":{"name":"*.txt","limit":5}}"#,
             .query(scope: "a/b", spec: { var s = QuerySpec(); s.name = "*.txt"; s.limit = 5; return s }())),
            (#"{"op":"query","scope":"","spec":{},"lines":true}"#, .query(scope: "", spec: QuerySpec(), lines: true)),
            (#"{"op":"restore","path":"a/b.txt","version":"v1"}"#, .restore(path: "a/b.txt", version: "v1")),
            (#"{"op":"kv-set","entry":{"key":"k","timeNs":3,"value":{"type":"number","value":2}}}"#,
             .kvSet(entry: KVEntry(key: "k", value: .number(2), timeNs: 3, device: ""))),
            (#"{"op":"pause"}"#, .pause(seconds: nil)), (#"{"op":"pause","seconds":3600}"#, .pause(seconds: 3600)),
            (#"{"op":"resume"}"#, .resume),
        ]
        for bad in [#"{"op":"pause","seconds":0}"#, #"{"op":"pause","seconds":-5}"#] {
            #expect(throws: ControlError.self) { try JSONDecoder().decode(ControlRequest.self, from: Data(bad.utf8)) }
        }
        for (text, r) in documented { #expect(try JSONDecoder().decode(ControlRequest.self, from: Data(text.utf8)) == r) }
        #expect(throws: ControlError.self) { try JSONDecoder().decode(ControlRequest.self, from: Data(#"{"op":"format-disk"}"#.utf8)) }
    }

    /// An answer of several megabytes goes out in pieces while the rows are read (as the
    /// socket takes them); the reader gets every row, in order, and the connection goes on.
    @Test func aLargeQueryAnswerComesWhole() throws {
        let store = try DirectoryStore(root: TempPaths.make("ubiq-ctl-store"))
        let a = try Device(store: store, uploadDelay: 3600)
        let served = try Served(a, store: store)
        try a.mkdir("many")
        let dir = try a.ino("many")
        let long = String(repeating: "n", count: 180)
        for i in 0 ..< 12_000 { _ = try a.fs.mknod(dir, Array("\(long)-\(i)".utf8), mode: UInt32(S_IFREG) | 0o644, rdev: 0, caller: .root) }
        let c = try served.connect()
        defer { c.close() }
        var spec = QuerySpec()
        spec.sort = "name"
        let rows = try c.request(.query(scope: "many", spec: spec), as: QueryReply.self).items
        #expect(rows.count == 12_000)
        #expect(rows.map(\.name) == (0 ..< 12_000).map { "\(long)-\($0)" }.sorted())
        spec.limit = 7
        #expect(try c.request(.query(scope: "many", spec: spec), as: QueryReply.self).items.map(\.name) == Array(rows.prefix(7).map(\.name)))
        // The same rows as lines (what `ubiq query` asks), in pieces as well; and the
        // connection goes on after them.
        var lines: [QueryRow] = []
        spec.limit = nil
        try c.query(scope: "many", spec: spec) { lines.append($0) }
        #expect(lines == rows)
        lines = []
        spec.limit = 7
        try c.query(scope: "many", spec: spec) { lines.append($0) }
        #expect(lines == Array(rows.prefix(7)))
        #expect(try c.request(.status, as: StatusReply.self).items == a.fs.inodeCount)
    }

    /// Names as JSON strings: every byte a name may hold comes back as it was (quotes,
    /// backslashes, control characters, any script).
    @Test func namesAsJSONStringsComeBackWhole() throws {
        var names = ["plain", "a \"quoted\" \\ name", "tab\tnew\nline\rret", "\u{01}\u{1f}\u{7f}", "été 日本 🎉", ""]
        names.append(String(decoding: (1 ... 127).map { UInt8($0) }, as: UTF8.self))
        for n in names {
            let text = jsonString(n)
            #expect(try JSONDecoder().decode(String.self, from: Data(text.utf8)) == n, "\(n.debugDescription) as \(text)")
            #expect(!text.utf8.dropFirst().dropLast().contains { $0 < 0x20 }, "no raw control character in \(text.debugDescription)")
        }
        #expect(jsonString("\u{01}\"\n") == #""\u0001\"\n""#)
    }

    /// Rows as lines are read plainly where they are as the daemon writes them, by JSONDecoder
    /// where not (a row this version does not read is a clear error, not a crash); an answer
    /// from a daemon that sends all rows at once is taken too.
    @Test func queryRowsAsLinesFromAnyDaemon() throws {
        let row = QueryRow(ino: 7, path: "a/b", rawPath: nil, name: "b", depth: 2, type: "file", size: 5, mtimeNs: 9,
                           status: .current, pinned: true)
        func answered(_ text: String) throws -> [QueryRow] {
            var fds: [Int32] = [0, 0]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
            let daemon = ControlConnection(fd: fds[1])
            defer { close(fds[0]); close(fds[1]) }
            #expect(daemon.sendRaw(text))
            shutdown(fds[1], Int32(SHUT_WR))  // all it says
            var rows: [QueryRow] = []
            try ControlConnection(fd: fds[0]).query(scope: "", spec: QuerySpec()) { rows.append($0) }
            #expect(daemon.nextLine(limit: 4096) == #"{"lines":true,"op":"query","scope":"","spec":{}}"#)
            return rows
        }
        let line = #"{"ino":7,"path":"a/b","name":"b","depth":2,"type":"file","size":5,"mtimeNs":9,"status":"current","pinned":true}"#
        #expect(try answered("{\"ok\":true}\n\(line)\n\(line)\n{\"count\":2,\"end\":true}\n") == [row, row])
        // Another order of its fields, spaces, and a field this version does not know: read all the same.
        let odd = #"{ "pinned": true, "status": "current", "mtimeNs": 9, "size": 5, "type": "file", "depth": 2, "name": "b", "path": "a/b", "ino": 7, "new": [1] }"#
        #expect(try answered("{\"ok\":true}\n\(odd)\n{\"count\":1,\"end\":true}\n") == [row])
        // A path's bytes that are not UTF-8.
        var raw = row
        raw.rawPath = [0x61, 0x2f, 0xff]
        let rawLine = #"{"ino":7,"path":"a/b","name":"b","rawPath":[97,47,255],"depth":2,"type":"file","size":5,"mtimeNs":9,"status":"current","pinned":true}"#
        #expect(try answered("{\"ok\":true}\n\(rawLine)\n{\"count\":1,\"end\":true}\n") == [raw])
        // All rows in one answer (a daemon from before lines).
        #expect(try answered("{\"ok\":true,\"items\":[\(line),\(rawLine)]}\n") == [row, raw])
        // A refusal; a row that is not one; a daemon gone before the last row.
        #expect(throws: ControlError("no such folder")) { try answered("{\"ok\":false,\"error\":\"no such folder\"}\n") }
        #expect(throws: ControlError.self) { try answered("{\"ok\":true}\n{\"ino\":1.5}\n") }
        #expect(throws: ControlError("the daemon closed the connection before the query's last row")) {
            try answered("{\"ok\":true}\n\(line)\n")
        }
    }

    @Test func statusSyncQueryAndRefusalsOverTheSocket() throws {
        let store = try DirectoryStore(root: TempPaths.make("ubiq-ctl-store"))
        let a = try Device(store: store)
        let served = try Served(a, store: store)
        try a.mkdir("docs")
        try a.write("docs/plan.txt", "one")
        a.sync()
        // A name that is not UTF-8: kept on this device (the store's keys are text), and found
        // by its own bytes.
        let odd: [UInt8] = [0x6f, 0x64, 0x64, 0xff, 0x2e, 0x74, 0x78, 0x74]
        let (_, fh) = try a.fs.create(try a.ino("docs"), odd, mode: 0o644, flags: O_WRONLY, caller: .root)
        try a.fs.flush(fh)
        a.fs.release(fh)
        a.sync()

        let c = try served.connect()
        defer { c.close() }
        let status = try c.request(.status, as: StatusReply.self)
        #expect(status.mount == "/mnt/test" && status.device == "dev-a" && status.pid == String(getpid()))
        #expect(status.items == a.fs.inodeCount && status.cacheLimit == String(1 << 30))
        _ = try c.request(.sync(full: false, wait: false), as: Done.self)
        _ = try c.request(.sync(full: true, wait: true), as: Done.self)

        var spec = QuerySpec()
        spec.type = "file"
        let rows = try c.request(.query(scope: "docs", spec: spec), as: QueryReply.self).items
        #expect(rows.map(\.path).contains("plan.txt"))
        #expect(rows.first { $0.path == "plan.txt" }?.rawPath == nil)
        let oddRow = try #require(rows.first { $0.rawPath != nil })
        #expect(oddRow.rawPath == odd, "the bytes of a name that is not UTF-8 come through whole")
        #expect(oddRow.status == .local)
        var lines: [QueryRow] = []
        try c.query(scope: "docs", spec: spec) { lines.append($0) }
        #expect(lines == rows, "as lines, the same rows")
        #expect(throws: ControlError.self) { try c.query(scope: "nothing", spec: spec) { _ in } }

        // Refusals are the daemon's words, and the connection goes on after them.
        try a.write("docs/new.txt", "not uploaded yet")
        #expect(throws: ControlError("docs/new.txt is not in the store yet: it has versions there once its first upload is done")) {
            try c.request(.history(path: "docs/new.txt"), as: HistoryReply.self)
        }
        #expect(throws: ControlError.self) { try c.request(.history(path: "docs/nothing.txt"), as: HistoryReply.self) }
        #expect(c.sendRaw("{\"op\":\"format-disk\"}\n"))
        #expect(c.nextLine(limit: 4096) == #"{"error":"unknown op format-disk","ok":false}"#)
        #expect(try c.request(.status, as: StatusReply.self).items == a.fs.inodeCount)
        // Paused, a sync is refused with why; resumed, it goes.
        _ = try c.request(.pause(seconds: nil), as: Done.self)
        #expect(try a.fs.getxattr(rootIno, Array("user.ubiq.sync-paused".utf8)) == Array("indefinitely".utf8))
        #expect(throws: ControlError("sync is paused until ubiq resume (ubiq resume goes on)")) {
            try c.request(.sync(full: false, wait: true), as: Done.self)
        }
        // A key-value set while paused is kept here, and goes once resumed.
        let stored = KVStoreClient(store: store, device: "reader")
        let held = try c.request(.kvSet(entry: KVEntry(key: "held", value: .number(1), timeNs: 5, device: "")), as: KVSetReply.self)
        #expect(held.won)
        #expect(try runBlocking { try await stored.get("held") } == nil, "a key-value set went up while paused")
        _ = try c.request(.resume, as: Done.self)
        #expect(waitUntil(seconds: 10) { (try? runBlocking { try await stored.get("held") }) != nil }, "not sent once resumed")
        #expect(try a.fs.getxattr(rootIno, Array("user.ubiq.sync-paused".utf8)).isEmpty)
        _ = try c.request(.sync(full: false, wait: true), as: Done.self)
        // A mount of a container's Documents has no key-value store to answer from.
        let documentsOnly = try Served(try Device(store: store), store: store, withKV: false)
        let d = try documentsOnly.connect()
        defer { d.close() }
        #expect(throws: ControlError.self) { try d.request(.kvList, as: KVListReply.self) }
    }

    @Test func versionsRestoreWatchAndKeyValuesOverTheSocket() throws {
        let store = try DirectoryStore(root: TempPaths.make("ubiq-ctl-store"))
        let a = try Device(store: store)
        let served = try Served(a, store: store)
        try a.write("plan.txt", "first")
        a.sync()
        try a.write("plan.txt", "second")
        a.sync()
        let c = try served.connect()
        defer { c.close() }
        let history = try c.request(.history(path: "plan.txt"), as: HistoryReply.self)
        try #require(history.versions.count == 2)
        #expect(history.versions.map(\.current) == [true, false])
        #expect(history.versions.map(\.size) == [6, 5])
        let first = history.versions[1].version
        let made = try c.request(.restore(path: "plan.txt", version: first), as: RestoreReply.self).version
        #expect(made != first && made != history.versions[0].version)
        #expect(try a.read("plan.txt") == "first")
        #expect(throws: ControlError("plan.txt has no version nope (ubiq versions --all lists them)")) {
            try c.request(.restore(path: "plan.txt", version: "nope"), as: RestoreReply.self)
        }

        // A watch: {"ok":true}, then a line per change, paths relative to the mount.
        let w = try served.connect()
        defer { w.close() }
        _ = try w.request(.watch(scope: ""), as: Done.self)
        try a.write("notes.txt", "hello")
        // Other files' events may come first (plan.txt's status as the restore's upload settles:
        // one run beside a busy machine saw that).
        var event = try #require(try w.next(WatchEvent.self))
        for _ in 0 ..< 20 where event.path != "notes.txt" { event = try #require(try w.next(WatchEvent.self)) }
        #expect(event.event == "changed" && event.path == "notes.txt" && event.rawPath == nil, "\(event)")
        // A name that is not UTF-8 comes through as its bytes, in a move's both paths too.
        let odd: [UInt8] = [0x63, 0x61, 0x66, 0xe9]
        let (_, fh) = try a.fs.create(rootIno, odd, mode: 0o644, flags: O_WRONLY, caller: .root)
        try a.fs.flush(fh)
        a.fs.release(fh)
        // (Other files' events may come first: notes.txt's close, plan.txt's status.)
        var created = try #require(try w.next(WatchEvent.self))
        while !(created.path ?? "").hasPrefix("caf") { created = try #require(try w.next(WatchEvent.self)) }
        #expect(created.event == "changed" && created.rawPath == odd && created.path == "caf\u{FFFD}", "\(created)")
        try a.fs.rename(rootIno, odd, rootIno, Array("cafe".utf8))
        var moved = try #require(try w.next(WatchEvent.self))
        while moved.event != "moved" { moved = try #require(try w.next(WatchEvent.self)) }
        #expect(moved.path == "cafe" && moved.rawPath == nil && moved.rawFrom == odd)

        // The key-value store: a JSON value keeps its structure (keys sorted), a removal wins.
        let set = try c.request(.kvSet(entry: KVEntry(key: "prefs", value: .json(#"{"b":1,"a":[true,null]}"#), timeNs: 10,
                                                     device: "")), as: KVSetReply.self)
        #expect(set.won && set.stands.device == "dev-a")
        #expect(try c.request(.kvGet(key: "prefs"), as: KVGetReply.self).result?.value == .json(#"{"a":[true,null],"b":1}"#))
        #expect(try c.request(.kvList, as: KVListReply.self).values.map(\.key) == ["prefs"])
        _ = try c.request(.kvSet(entry: KVEntry(key: "prefs", value: nil, timeNs: 11, device: "")), as: KVSetReply.self)
        #expect(try c.request(.kvGet(key: "prefs"), as: KVGetReply.self).result?.value == nil)
        #expect(try c.request(.kvList, as: KVListReply.self).values.isEmpty)
    }
}
