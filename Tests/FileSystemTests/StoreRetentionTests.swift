import Foundation
import GRDB
import Testing
import TestSupport
import UbiqFS
@testable import UbiqStore

/// The embedded store's journal keeps its entries for `journalRetention` (30 days), not
/// forever: a device whose cursor stands in what was dropped compares everything, as after a
/// restore, and keeps what it has not uploaded yet.
@Suite struct JournalRetentionTests {
    /// Moves every journal entry up to `seq` (all: nil) back by `by` seconds, as time would.
    static func age(_ store: DirectoryStore, through seq: Int64? = nil, by: TimeInterval) throws {
        let db = try DatabaseQueue(path: store.root.appendingPathComponent("store.db").path)
        try db.write {
            try $0.execute(sql: "UPDATE journal SET at = at - ? WHERE seq <= ?", arguments: [by, seq ?? Int64.max])
        }
    }

    static func journalCount(_ store: DirectoryStore) throws -> Int {
        try DatabaseQueue(path: store.root.appendingPathComponent("store.db").path).read {
            try Int.fetchOne($0, sql: "SELECT count(*) FROM journal") ?? 0
        }
    }

    @Test func entriesPastTheRetentionAreDroppedAndACursorInThemComparesEverything() async throws {
        let store = try DirectoryStore(root: TempPaths.make("ubiq-store"), journalRetention: 100)
        try await HostileStoreTests.put(store, "a", "1")                     // entry 1
        let atA = try await store.currentCursor()
        try await HostileStoreTests.put(store, "b", "2")                     // entry 2
        let atB = try await store.currentCursor()
        try await HostileStoreTests.put(store, "c", "3")                     // entry 3
        try await store.delete("a", condition: .always)                     // entry 4
        let atEnd = try await store.currentCursor()
        // Young entries stay.
        #expect(try store.pruneJournal() == 0)
        #expect(try Self.journalCount(store) == 4)

        // Entries 1 and 2 are older than the retention: 2 is the newest of them and stays, so a
        // cursor on it goes on; 1 goes.
        try Self.age(store, through: 2, by: 1000)
        #expect(try store.pruneJournal() == 1)
        #expect(try Self.journalCount(store) == 3)
        let fromB = try await store.changes(since: atB, limit: 100)
        #expect(!fromB.reset)
        #expect(fromB.changes.map(\.key) == ["c", "a"])
        for stale in [atA, "0", nil] {
            #expect(try await store.changes(since: stale, limit: 100).reset, "cursor \(stale ?? "none")")
        }
        // A bare number (a cursor from before marks) after entry 1 still goes on from entry 2.
        #expect(try await store.changes(since: "1", limit: 100).changes.map(\.key) == ["b", "c", "a"])

        // Everything old: all but the newest entry go, so the journal's end (and a cursor at it) stays.
        try Self.age(store, by: 1000)
        #expect(try store.pruneJournal() == 2)
        #expect(try Self.journalCount(store) == 1)
        #expect(try await store.currentCursor() == atEnd)
        let idle = try await store.changes(since: atEnd, limit: 100)
        #expect(!idle.reset && idle.changes.isEmpty)
        #expect(try await store.changes(since: atB, limit: 100).reset)

        // The next change follows on from the end.
        try await HostileStoreTests.put(store, "d", "4")
        let next = try await store.changes(since: atEnd, limit: 100)
        #expect(!next.reset && next.changes.map(\.key) == ["d"])
    }

    /// The journal is pruned when a store is opened and by a write once the last prune is an
    /// interval old; entries written before the journal had times are older than any that has
    /// one.
    @Test func openingAndWritingPruneAndEntriesWithoutATimeAreTheOldest() async throws {
        let root = TempPaths.make("ubiq-store")
        let store = try DirectoryStore(root: root, journalRetention: 100)
        // Two entries as a store from before times wrote them, then one with a time.
        let index = try HostileStoreTests.Index(store)
        try index.journal(op: "put", key: "old1", version: "v1")
        try index.journal(op: "put", key: "old2", version: "v1")
        try await HostileStoreTests.put(store, "a", "1")                     // entry 3
        try await HostileStoreTests.put(store, "b", "2")                     // entry 4
        // Nothing dated is old yet, so the undated entries stay too: nothing proves them old.
        #expect(try store.pruneJournal() == 0)

        try Self.age(store, through: 3, by: 1000)
        let reopened = try DirectoryStore(root: root, journalRetention: 100)
        #expect(try Self.journalCount(reopened) == 2, "opening the store drops the undated entries and keeps entry 3, the newest old one")

        // A write prunes once the last prune is an interval old, not before.
        try Self.age(reopened, through: 4, by: 1000)
        try await HostileStoreTests.put(reopened, "c", "3")                  // entry 5
        #expect(try Self.journalCount(reopened) == 3)
        reopened.lastPrune.withLock { $0 = Date(timeIntervalSinceNow: -DirectoryStore.journalPruneInterval) }
        try await HostileStoreTests.put(reopened, "d", "4")                  // entry 6
        #expect(try Self.journalCount(reopened) == 3, "entries 4, 5 and 6 are left")
    }

    /// A device away for longer than the retention: its cursor's entry was dropped. It compares
    /// the store with what it recorded, so it learns of the delete, the edit and the new file
    /// made meanwhile, keeps its own edits made before it went away (they go up after), and
    /// then follows the journal again.
    @Test func aDeviceAwayLongerThanTheJournalIsKeptCatchesUpAndKeepsItsEdits() async throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.write("f1", "one")
        try a.write("f2", "two")
        try a.write("g", "gee")
        a.sync()
        let b = try Device(store: store, uploadDelay: 3600)
        #expect(try b.names("") == ["f1", "f2", "g"])
        try b.write("g", "b's edit")
        try b.write("mine", "b's own")

        try a.fs.unlink(rootIno, n("f1"))
        try a.write("f2", "two, again")
        try a.write("f3", "three")
        a.sync()
        try Self.age(store, by: DirectoryStore.defaultJournalRetention + 60)
        #expect(try store.pruneJournal() > 0)

        b.pull()
        #expect(b.log.count("comparing everything") == 1, "\(b.log.all)")
        #expect(try b.names("") == ["f2", "f3", "g", "mine"])
        #expect(try b.read("f2") == "two, again")
        #expect(try b.read("f3") == "three")
        #expect(try b.read("g") == "b's edit")
        #expect(try b.read("mine") == "b's own")
        b.sync()
        #expect(try contents(store, "g") == "b's edit")
        #expect(try contents(store, "mine") == "b's own")
        #expect(try await store.list(prefix: "").map(\.key).sorted() == ["f2", "f3", "g", "mine"])

        try a.write("f4", "four")
        a.sync()
        b.pull()
        #expect(try b.read("f4") == "four")
        #expect(b.log.count("comparing everything") == 1, "after the comparison the device follows the journal again")
    }
}

/// A deleted key's versions are kept for the store's retention (30 days), as a cloud service's
/// bin keeps them, then dropped with the blobs nothing else uses: deleting a file frees its
/// space in the store. Before, a deleted file's bytes stayed for good.
@Suite struct DeletedRetentionTests {
    /// Moves the deletes of `keys` back by `by` seconds, as time would.
    static func ageDeletes(_ store: DirectoryStore, of keys: [String], by: TimeInterval) throws {
        let db = try DatabaseQueue(path: store.root.appendingPathComponent("store.db").path)
        try db.write { db in
            for k in keys { try db.execute(sql: "UPDATE deleted SET at = at - ? WHERE key = ?", arguments: [by, k]) }
        }
    }

    static func blobFiles(_ store: DirectoryStore) -> Set<String> {
        let e = FileManager.default.enumerator(atPath: store.root.appendingPathComponent("blobs").path)
        var out: Set<String> = []
        while let p = e?.nextObject() as? String {
            if p.contains("/") { out.insert(URL(fileURLWithPath: p).lastPathComponent) }
        }
        return out
    }

    @Test func aDeletedKeysVersionsGoAfterTheRetentionAndTheirBytesWithThem() async throws {
        let store = try DirectoryStore(root: TempPaths.make("ubiq-store"), journalRetention: 100)
        try await HostileStoreTests.put(store, "a", "a1")
        try await HostileStoreTests.put(store, "a", "a2")
        let aBlobs = Set(try await store.versions(of: "a").compactMap(\.contentTag))
        try await store.delete("a", condition: .always)
        try await HostileStoreTests.put(store, "b", "young")
        try await store.delete("b", condition: .always)
        try await HostileStoreTests.put(store, "c", "shared")
        let c = try await store.head("c")
        _ = try await store.copy(from: "c", version: c.version, to: "d", metadata: nil, condition: .always)
        try await store.delete("d", condition: .always)
        try await HostileStoreTests.put(store, "e", "e1")
        try await store.delete("e", condition: .always)
        try await HostileStoreTests.put(store, "e", "e2")
        #expect(aBlobs.count == 2 && aBlobs.isSubset(of: Self.blobFiles(store)))
        #expect(try store.pruneDeleted() == 0, "nothing is old yet")

        try Self.ageDeletes(store, of: ["a", "d", "e"], by: 1000)
        #expect(try store.pruneDeleted(batch: 1) == 3, "a's two versions and d's one, a batch of one key at a time")
        #expect(try await store.versions(of: "a").isEmpty)
        #expect(try await store.versions(of: "d").isEmpty)
        #expect(try await store.versions(of: "b").count == 1, "deleted within the retention: kept")
        #expect(try await store.versions(of: "e").count == 2, "made again: its history stays")
        let left = Self.blobFiles(store)
        #expect(aBlobs.isDisjoint(with: left), "the deleted key's bytes left the store")
        #expect(left.contains(c.contentTag ?? ""), "the copy's blob is the source's too, and stays")
        #expect(String(decoding: try await store.read("c", version: c.version, range: 0 ..< 100), as: UTF8.self) == "shared")
        #expect(try store.pruneDeleted() == 0)

        // A copy of a version that was dropped is refused, not made without bytes.
        try await HostileStoreTests.put(store, "f", "f1")
        let f = try await store.head("f")
        try await store.delete("f", condition: .always)
        try Self.ageDeletes(store, of: ["f"], by: 1000)
        #expect(try store.pruneDeleted() == 1)
        await #expect(throws: StoreError.self) {
            _ = try await store.copy(from: "f", version: f.version, to: "g", metadata: nil, condition: .always)
        }
        #expect(try await store.list(prefix: "").map(\.key).sorted() == ["c", "e"])
    }

    /// A store from before the deletes were noted: its deleted keys are found when it is opened
    /// (their time the newest version's) and go by the same rule.
    @Test func keysDeletedBeforeTheUpgradeGoToo() async throws {
        let root = TempPaths.make("ubiq-store")
        let store = try DirectoryStore(root: root, journalRetention: 100)
        try await HostileStoreTests.put(store, "old", "bytes")
        let blob = try await store.head("old").contentTag ?? ""
        try await store.delete("old", condition: .always)
        try await HostileStoreTests.put(store, "live", "bytes")
        // As the store was before the upgrade: no table of deletes, the migration not applied.
        let db = try DatabaseQueue(path: root.appendingPathComponent("store.db").path)
        try await db.write { db in
            try db.execute(sql: """
                DROP TABLE deleted; DROP INDEX objects_blob; DROP INDEX versions_blob;
                DELETE FROM grdb_migrations WHERE identifier = 'v4: deleted keys';
                UPDATE versions SET modified = modified - 1000 WHERE key = 'old';
                """)
        }
        let upgraded = try DirectoryStore(root: root, journalRetention: 100)
        #expect(try await upgraded.versions(of: "old").isEmpty, "opening the upgraded store drops what is past the retention")
        #expect(!Self.blobFiles(upgraded).contains(blob))
        #expect(try await upgraded.versions(of: "live").count == 1)
    }

    /// What anyone with the folder may plant: a version whose blob names a path, keys that are
    /// not text, a time that is not one. None removes a file outside `blobs/`, nor keeps the
    /// prune going round.
    @Test func plantedVersionsRemoveNothingElsewhere() throws {
        let store = try DirectoryStore(root: TempPaths.make("ubiq-store"), journalRetention: 100)
        let target = store.root.appendingPathComponent("keep-me")
        try Data("precious".utf8).write(to: target)
        let db = try DatabaseQueue(path: store.root.appendingPathComponent("store.db").path)
        try db.write { db in
            try db.execute(sql: "INSERT INTO versions (key, version, size, meta, blob, modified) VALUES ('x', 'v1', 0, x'', '../../keep-me', 0)")
            try db.execute(sql: "INSERT INTO deleted (key, at) VALUES ('x', 0)")
            for i in 0 ..< 5 {
                let key = Data("blobkey\(i)".utf8)
                try db.execute(sql: "INSERT INTO versions (key, version, size, meta, blob, modified) VALUES (?, 'v1', 0, x'', 'b', 0)",
                               arguments: [key])
                try db.execute(sql: "INSERT INTO deleted (key, at) VALUES (?, 0)", arguments: [key])
            }
            try db.execute(sql: "INSERT INTO deleted (key, at) VALUES (42, 'not a time')")
        }
        #expect(try store.pruneDeleted(batch: 2) == 6, "x's version and each blob-typed key's, each as stored")
        #expect(FileManager.default.fileExists(atPath: target.path))
        #expect(try store.pruneDeleted() == 0)
    }
}
