import Foundation
import GRDB
import Testing
import TestSupport
@testable import UbiqFS
@testable import UbiqState
@testable import UbiqStore
@testable import UbiqSync

/// Whatever another device, a newer client or a malicious writer puts in the store, a device
/// keeps running and keeps syncing everything else: the bad item is left out (or read with
/// safe defaults), said once in the log, and the good ones arrive.
@Suite struct HostileStoreTests {
    /// Writes rows into the embedded store's index as anyone with the folder could.
    struct Index {
        let db: DatabaseQueue
        init(_ store: DirectoryStore) throws {
            db = try DatabaseQueue(path: store.root.appendingPathComponent("store.db").path)
        }

        /// An object and its journal entry, every column as given (any SQLite type).
        func plant(key: DatabaseValueConvertible?, version: DatabaseValueConvertible? = "v1", size: DatabaseValueConvertible? = 0,
                   meta: DatabaseValueConvertible?, blob: DatabaseValueConvertible? = "none", op: DatabaseValueConvertible? = "put") throws {
            try db.write { db in
                try db.execute(sql: "INSERT OR REPLACE INTO objects (key, version, size, meta, blob, modified) VALUES (?, ?, ?, ?, ?, 0)",
                               arguments: [key, version ?? "v", size ?? 0, meta ?? Data(), blob ?? "b"])
                try db.execute(sql: "INSERT INTO journal (op, key, version) VALUES (?, ?, ?)", arguments: [op ?? "put", key, version])
            }
        }

        /// A journal entry alone.
        func journal(op: DatabaseValueConvertible, key: DatabaseValueConvertible, version: DatabaseValueConvertible?) throws {
            try db.write { try $0.execute(sql: "INSERT INTO journal (op, key, version) VALUES (?, ?, ?)", arguments: [op, key, version]) }
        }
    }

    static func meta(_ fields: [String: Any]) -> Data {
        var all: [String: Any] = ["kind": "file", "mode": 420, "uid": 0, "gid": 0, "mtimeNs": 0, "rdev": 0, "xattrs": [String: String]()]
        for (k, v) in fields { all[k] = v }
        return try! JSONSerialization.data(withJSONObject: all)
    }

    static func put(_ store: DirectoryStore, _ key: String, _ text: String) async throws {
        let src = TempPaths.make("ubiq-src")
        try Data(text.utf8).write(to: src)
        _ = try await store.put(key, contentsOf: src, metadata: ObjectMetadata(kind: .file, sha256: try ContentDigest.of(path: src.path)),
                                condition: .always)
    }

    /// Keys the store's index holds that are not keys (not UTF-8, a NUL, a malformed path) are
    /// left out of a listing in pages as of a whole one, and the pages go on past them (a page
    /// of only such keys is not the end).
    @Test func aListingInPagesPassesOverKeysThatAreNot() async throws {
        let store = try newStore()
        let index = try Index(store)
        try await Self.put(store, "a", "1")
        try index.plant(key: Data([0x62, 0xFF, 0xFE]), meta: Self.meta([:]))
        try index.plant(key: Data([0x62, 0x00, 0x63]), meta: Self.meta([:]))
        try index.plant(key: "b//c", meta: Self.meta([:]))
        // The same bytes as text values, which sort among the good keys (blobs sort after all text).
        for hex in ["62FFFE", "620063", "62"] {
            try await index.db.write { db in
                try db.execute(sql: "INSERT INTO objects (key, version, size, meta, blob, modified) VALUES (CAST(X'\(hex)' AS TEXT) || ?, 'v', 0, ?, 'b', 0)",
                               arguments: [hex == "62" ? "/./x" : "", Self.meta([:])])
            }
        }
        try await Self.put(store, "c", "2")
        #expect(try await store.list(prefix: "").map(\.key) == ["a", "c"])
        for size in [1, 2, 3] {
            var keys: [String] = []
            try await store.list(prefix: "", pagesOf: size) { keys += $0.map(\.key) }
            #expect(keys == ["a", "c"], "pages of \(size)")
        }
    }

    /// The journal names a key that is not UTF-8 (it crashed every device that polled it).
    @Test func aJournalKeyThatIsNotUTF8IsPassedOverOnce() async throws {
        let store = try newStore()
        let a = try Device(store: store)
        let index = try Index(store)
        try index.plant(key: Data([0x62, 0xFF, 0xFE, 0x2E, 0x74]), meta: Self.meta([:]))
        try index.journal(op: Data([0xC3]), key: "x", version: nil)
        try index.journal(op: 7, key: 8, version: 9.5)
        try await Self.put(store, "after", "good")
        a.pull()
        #expect(try a.read("after") == "good")
        #expect(a.log.count("cannot be read") == 3, "\(a.log.all)")
        a.pull()
        #expect(a.log.count("cannot be read") == 3, "said once")
        // A new device lists the store (the listing leaves the key out too).
        let b = try Device(store: store)
        #expect(try b.names("") == ["after"])
    }

    /// An item id (`fileID`) that is not one (too long, or a path, or not text) is read as none,
    /// said once: nothing is paired or recorded by it, and the item comes in.
    @Test func anItemIDThatIsNotOneIsReadAsNone() throws {
        let store = try newStore()
        let a = try Device(store: store)
        let index = try Index(store)
        try index.plant(key: "long", meta: Self.meta(["kind": "file", "fileID": String(repeating: "a", count: 65)]))
        try index.plant(key: "path", meta: Self.meta(["kind": "file", "fileID": "../../etc"]))
        try index.plant(key: "number", meta: Self.meta(["kind": "file", "fileID": 7]))
        try index.plant(key: "fine", meta: Self.meta(["kind": "file", "fileID": String(repeating: "b", count: 64)]))
        a.pull()
        #expect(try a.names("") == ["fine", "long", "number", "path"])
        #expect(a.log.count("metadata read with defaults") == 3, "\(a.log.all)")
        let ids = try a.state.read { tx in try ["fine", "long", "number", "path"].map { try tx.entries(remoteKey: $0).first?.remoteFileID } }
        #expect(ids == [String(repeating: "b", count: 64), nil, nil, nil])
    }

    /// Metadata that does not decode (it stopped the change feed on every device for good):
    /// the item comes in with safe defaults, said once; the rest goes on.
    @Test func metadataThatDoesNotDecodeIsReadWithDefaults() async throws {
        let store = try newStore()
        let a = try Device(store: store)
        let index = try Index(store)
        try index.plant(key: "whiteout", meta: Self.meta(["kind": "whiteout"]))
        try index.plant(key: "negative", meta: Self.meta(["mode": -5, "uid": -1, "mtimeNs": "soon"]))
        try index.plant(key: "notjson", meta: Data("{{{".utf8))
        try index.plant(key: "array", meta: Data("[1,2]".utf8))
        try index.plant(key: "textmeta", meta: "not even bytes")
        try await Self.put(store, "after", "good")
        a.pull()
        #expect(try a.read("after") == "good")
        #expect(try a.names("") == ["after", "array", "negative", "notjson", "textmeta", "whiteout"])
        let neg = try a.fs.getattr(try a.ino("negative"))
        #expect(neg.mode & 0o7777 == 0o644 && neg.uid == getuid())
        #expect(a.log.count("metadata read with defaults") == 5, "\(a.log.all)")
        a.pull()
        #expect(a.log.count("metadata read with defaults") == 5, "said once")
        // A new device mounts the whole tree, not an empty one.
        let b = try Device(store: store)
        #expect(try b.names("") == ["after", "array", "negative", "notjson", "textmeta", "whiteout"])
        #expect(try b.read("after") == "good")
    }

    /// Sizes no disk holds (one crashed the daemon on open), negative sizes, columns of the
    /// wrong type: the item is left out, said once.
    @Test func impossibleSizesAndBrokenRecordsAreLeftOut() async throws {
        let store = try newStore()
        let a = try Device(store: store)
        let index = try Index(store)
        try index.plant(key: "max", size: Int64.max, meta: Self.meta([:]))
        try index.plant(key: "huge", size: Int64(1) << 62, meta: Self.meta([:]))
        try index.plant(key: "negative", size: -1, meta: Self.meta([:]))
        // (SQLite's column affinity makes "12" a size of 12 and 42 a version "42": those are fine.)
        try index.plant(key: "bytesize", size: Data([1, 2]), meta: Self.meta([:]))
        try index.plant(key: "realsize", size: 1.5, meta: Self.meta([:]))
        try index.plant(key: "badversion", version: Data([0xFF, 0xFE]), meta: Self.meta([:]))
        try index.plant(key: "badtag", meta: Self.meta([:]), blob: Data([0xC3]))
        try await Self.put(store, "after", "good")
        a.pull()
        #expect(try a.names("") == ["after"])
        #expect(try a.read("after") == "good")
        #expect(a.log.count("skipping") == 7, "\(a.log.all)")
        a.pull()
        #expect(a.log.count("skipping") == 7, "said once")
        let b = try Device(store: store)
        #expect(try b.names("") == ["after"])
    }

    /// Link targets a disk cannot hold (one with NUL was cut short; 100 KB ones were taken).
    @Test func linkTargetsWithNULOrTooLongAreLeftOut() async throws {
        let store = try newStore()
        let a = try Device(store: store)
        let index = try Index(store)
        try index.plant(key: "nul", meta: Self.meta(["kind": "symlink", "target": Data("a\0b".utf8).base64EncodedString()]))
        try index.plant(key: "long", meta: Self.meta(["kind": "symlink", "target": Data(repeating: 0x61, count: 100_000).base64EncodedString()]))
        try index.plant(key: "none", meta: Self.meta(["kind": "symlink"]))
        try index.plant(key: "fine", meta: Self.meta(["kind": "symlink", "target": Data(repeating: 0x61, count: 4095).base64EncodedString()]))
        a.pull()
        #expect(try a.names("") == ["fine"])
        #expect(try a.fs.readlink(try a.ino("fine")).count == 4095)
        let b = try Device(store: store)
        #expect(try b.names("") == ["fine"])
    }

    /// Extended attributes are bounded as on a local disk (a file once took 2,000 values of
    /// 4,000 bytes): a write past 256 KiB in all gets ENOSPC; the store's past it are left out.
    @Test func extendedAttributesHaveTheLimitsOfADisk() async throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.write("f", "x")
        let f = try a.ino("f")
        let value = [UInt8](repeating: 7, count: 4000)
        var set = 0
        do {
            for i in 0 ..< 2000 {
                try a.fs.setxattr(f, Array("user.a\(i)".utf8), value, mode: .any)
                set += 1
            }
        } catch FSError.noSpace {}
        #expect(set > 60 && set < 70, "\(set) values of 4000 bytes")
        // Replacing one counts it once; removing one makes room.
        try a.fs.setxattr(f, Array("user.a0".utf8), value, mode: .replace)
        try a.fs.removexattr(f, Array("user.a1".utf8))
        try a.fs.setxattr(f, Array("user.b".utf8), value, mode: .create)
        a.sync()
        // From the store: the same bound.
        var many: [String: String] = [:]
        for i in 0 ..< 500 { many["user.z\(i)"] = Data(value).base64EncodedString() }
        many["user.toolong-" + String(repeating: "n", count: 300)] = ""
        try Index(store).plant(key: "decorated", meta: Self.meta(["xattrs": many]))
        let b = try Device(store: store)
        let kept = try b.fs.listxattr(try b.ino("decorated")).filter { $0.starts(with: Array("user.z".utf8)) }
        #expect(kept.count > 60 && kept.count < 70, "\(kept.count) kept")
        #expect(b.log.count("extended attributes over the limits left out") == 1, "\(b.log.all)")
        #expect(try b.fs.listxattr(try b.ino("f")).filter { !$0.starts(with: Array("user.ubiq.".utf8)) }.count == set)
    }

    /// Names equal under Unicode normalization are two names (the feed once deduplicated them
    /// as Strings, and the second was lost on other devices).
    @Test func namesEqualUnderNormalizationAreTwoNames() async throws {
        let store = try newStore()
        let a = try Device(store: store)
        let b = try Device(store: store)
        let nfc = "r\u{E9}sum\u{E9}.txt", nfd = "re\u{301}sume\u{301}.txt"
        try a.write(nfc, "composed")
        try a.write(nfd, "decomposed")
        a.sync()
        #expect(try await store.list(prefix: "").count == 2)
        b.pull()
        let names = try b.fs.readdir(try b.fs.opendir(rootIno), offset: 0).map(\.name).filter { $0 != Array(".".utf8) && $0 != Array("..".utf8) }
        #expect(Set(names) == [Array(nfc.utf8), Array(nfd.utf8)])
        #expect(try b.read(nfc) == "composed")
        #expect(try b.read(nfd) == "decomposed")
        // And a new device's listing.
        let c = try Device(store: store)
        #expect(try c.read(nfc) == "composed" && c.read(nfd) == "decomposed")
        // Removing one removes only that one.
        try a.fs.unlink(rootIno, Array(nfd.utf8))
        a.sync()
        b.pull()
        #expect(try b.read(nfc) == "composed")
        #expect(throws: FSError.self) { try b.ino(nfd) }
    }

    /// Keys that put a file where another key's folder would be (another tool's, or two devices
    /// that had not seen each other's change): the file comes in, what would be below it is
    /// passed over with a warning each, and the folders beside it come in whole (the import
    /// looks a folder up once for all of its files).
    @Test func aFileWhereAFolderWouldBeIsPassedOverAlone() async throws {
        let store = try newStore()
        try await Self.put(store, "a", "file a")
        for k in ["a/b", "a/c/d", "c/d", "c/e", "c/f/g", "c/f/h", "c/z", "d/e/f", "d/z", "e"] { try await Self.put(store, k, "is " + k) }
        let b = try Device(store: store)
        #expect(try b.names("") == ["a", "c", "d", "e"])
        #expect(try b.read("a") == "file a")
        #expect(try b.names("c") == ["d", "e", "f", "z"])
        #expect(try b.names("c/f") == ["g", "h"])
        #expect(try b.names("d") == ["e", "z"])
        for k in ["c/d", "c/f/h", "c/z", "d/e/f", "d/z", "e"] { #expect(try b.read(k) == "is " + k) }
        #expect(b.log.count("a file stands where its folder would be") == 2, "\(b.log.all)")
    }

    /// Thousands of random and hostile records through the whole import path (journal,
    /// listing, metadata, sizes, names, link targets, xattrs): no crash, and good records
    /// that come after bad ones still arrive, on a following device and on a new one.
    @Test func fuzzTheImportPath() async throws {
        let seed = ProcessInfo.processInfo.environment["UBIQ_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 0 ... 1 << 40)
        print("HostileStoreTests.fuzzTheImportPath seed \(seed) (UBIQ_SEED=\(seed) replays it)")
        var rng = SplitMix(state: seed)
        let store = try newStore()
        let a = try Device(store: store)
        let index = try Index(store)
        var good: [String: String] = [:]
        for round in 0 ..< 20 {
            for _ in 0 ..< 150 { try Self.plantHostile(index, &rng) }
            let key = "good-\(round)", text = "content \(round) \(rng.next())"
            try await Self.put(store, key, text)
            good[key] = text
            a.pull()
            #expect(try a.read(key) == text, "round \(round), seed \(seed)")
        }
        let b = try Device(store: store)
        for (k, v) in good { #expect(try b.read(k) == v, "\(k), seed \(seed)") }
        for (k, v) in good { #expect(try a.read(k) == v, "\(k), seed \(seed)") }
    }

    static func plantHostile(_ index: Index, _ rng: inout SplitMix) throws {
        func pick<T>(_ xs: [T]) -> T { xs[Int(rng.next() % UInt64(xs.count))] }
        func bytes(_ n: Int) -> Data { Data((0 ..< n).map { _ in UInt8(truncatingIfNeeded: rng.next()) }) }
        let name = "h\(rng.next() % 100_000)"
        let keys: [DatabaseValueConvertible?] = [
            name, name + "/", "h/" + name, "..", "h/../" + name, "/" + name, "h//" + name, name + "\u{0}x",
            String(repeating: "x", count: 300), Data([0x68]) + bytes(6), bytes(12), 12345, 1.25, nil,
            "h-r\u{E9}sum\u{E9}", "h-re\u{301}sume\u{301}", ".ubiquity/" + name, "h-dir/" + name + "/deeper",
        ]
        let kinds: [Any] = ["file", "directory", "symlink", "fifo", "socket", "charDevice", "blockDevice", "whiteout", 3, NSNull(), ["x"]]
        let numbers: [Any] = [0, 420, -5, Int64.max, Int64.min, 1e300, "12", NSNull(), [1], 0o7777, UInt32.max]
        let targets: [Any] = [Data("ok".utf8).base64EncodedString(), Data("a\0b".utf8).base64EncodedString(),
                              Data(repeating: 0x61, count: 5000).base64EncodedString(), "not base64 !!", 5, NSNull(), ""]
        let xattrs: [Any] = [["user.a": Data("v".utf8).base64EncodedString()], ["user.big": Data(count: 70_000).base64EncodedString()],
                             ["trusted.x": "!!"], ["": ""], "x", NSNull(), [String: String]()]
        var fields: [String: Any] = [:]
        for f in ["kind", "mode", "uid", "gid", "mtimeNs", "rdev", "target", "xattrs", "origin", "device", "sha256"] where rng.next() % 3 == 0 {
            switch f {
            case "kind": fields[f] = pick(kinds)
            case "target": fields[f] = pick(targets)
            case "xattrs": fields[f] = pick(xattrs)
            case "origin", "device", "sha256": fields[f] = pick([String(repeating: "f", count: 64), "", 7, NSNull()] as [Any])
            default: fields[f] = pick(numbers)
            }
        }
        let metas: [DatabaseValueConvertible?] = [meta(fields), meta(fields), meta(fields), bytes(40), Data("null".utf8),
                                                  Data("\"s\"".utf8), "text meta", 99, nil]
        let sizes: [DatabaseValueConvertible?] = [0, 5, -1, Int64.max, Int64(1) << 62, Int64(1) << 44, "7", 2.5, nil]
        let versions: [DatabaseValueConvertible?] = ["v\(rng.next())", "", 4, bytes(5), nil]
        let ops: [DatabaseValueConvertible?] = ["put", "put", "delete", "other", bytes(3), 1]
        if rng.next() % 4 == 0 {
            try index.journal(op: pick(ops) ?? "put", key: pick(keys) ?? "k", version: pick(versions))
        } else {
            try index.plant(key: pick(keys) ?? name, version: pick(versions), size: pick(sizes), meta: pick(metas),
                            blob: pick(["none", "", 17, bytes(4)] as [DatabaseValueConvertible?]), op: pick(ops))
        }
    }
}

/// The store's disk failing is a fault that heals: what was to go up waits, says why, and goes
/// once the store is back (it was taken for a permanent failure, and the file stayed in
/// `error`, not in the store, after the store was repaired).
@Suite struct StoreDiskFaultTests {
    @Test func aStoreFolderThatFailsHealsAndTheUploadGoes() throws {
        let store = try newStore()
        let a = try Device(store: store)
        let tmp = store.root.appendingPathComponent("tmp").path
        #expect(rename(tmp, tmp + ".away") == 0)
        try a.write("f", "waits")
        let ino = try a.ino("f")
        for _ in 0 ..< 3 { _ = a.uploader.processRound(ignoringDelay: true) }
        #expect(try a.state.read { try $0.outboxCount() } == 1, "still queued")
        #expect(try a.state.read { try $0.uploadErrorCount() } == 0, "not failed for good")
        #expect(try a.state.read { try $0.uploadErrors()[ino]?.error }?.contains("No such file") == true)
        #expect(rename(tmp + ".away", tmp) == 0)
        a.sync()
        #expect(try runBlocking { try await store.head("f") }.size == 5)
        #expect(try a.state.read { try $0.uploadErrorCount() } == 0)
    }
}

/// A local name that is not valid UTF-8 cannot be a store key: the item is kept on this device
/// only, and says `local` (docs/status.md), not `error`.
@Suite struct LocalOnlyNameTests {
    @Test func aNameThatIsNotUTF8IsLocalNotAnError() throws {
        let store = try newStore()
        let a = try Device(store: store)
        let name: [UInt8] = [0x66, 0xFF, 0x2E, 0x74]
        let (_, fh) = try a.fs.create(rootIno, name, mode: 0o644, flags: O_WRONLY, caller: .root)
        try a.fs.flush(fh)
        a.fs.release(fh)
        a.sync()
        let ino = try a.fs.lookup(rootIno, name).ino
        let attr = { (n: String) in String(decoding: try a.fs.getxattr(ino, Array("user.ubiq.\(n)".utf8)), as: UTF8.self) }
        #expect(try attr("status") == "local")
        #expect(try attr("uploading-error").contains("not valid UTF-8"), "says why it stays here")
        #expect(try attr("uploaded") == "0")
        #expect(String(decoding: try a.fs.getxattr(rootIno, Array("user.ubiq.items-errors".utf8)), as: UTF8.self) == "0")
        #expect(try a.fs.query(scope: "", QuerySpec()).first?.status == .local)
        #expect(try runBlocking { try await store.list(prefix: "") }.isEmpty)
        // Renamed to a name the store can hold, it goes up.
        try a.fs.rename(rootIno, name, rootIno, Array("fine.t".utf8))
        a.sync()
        #expect(try runBlocking { try await store.list(prefix: "") }.map(\.key) == ["fine.t"])
    }
}

/// A store restored from a backup: its journal ends before a device's cursor. The device once
/// never saw the restored store's first new changes (their numbers were below its cursor);
/// now it compares everything, keeping what it has not uploaded yet.
@Suite struct RestoredStoreTests {
    @Test func aCursorPastTheJournalsEndComparesEverything() async throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.write("f1", "one")
        a.sync()
        // The backup, taken now (the index and its WAL, the blobs).
        let backup = TempPaths.make("ubiq-backup")
        try FileManager.default.copyItem(at: store.root, to: backup)
        try a.write("f2", "two")
        a.sync()
        let b = try Device(store: store)
        #expect(try b.names("") == ["f1", "f2"])
        // The store is restored from the backup; b goes on with it.
        let restored = try DirectoryStore(root: backup)
        #expect(restored.identity == store.identity)
        let b2 = try Device(store: restored, dir: b.dir)
        try b2.write("mine", "not yet uploaded")
        let c = try Device(store: restored)
        try c.write("f3", "after the restore")
        c.sync()
        b2.pull()
        #expect(try b2.read("f3") == "after the restore", "the restored store's new change was missed")
        #expect(try b2.read("mine") == "not yet uploaded")
        #expect(b2.log.count("comparing everything") == 1, "\(b2.log.all)")
        b2.sync()
        #expect(try runBlocking { try await restored.list(prefix: "") }.map(\.key).sorted() == ["f1", "f3", "mine"])
    }
}
