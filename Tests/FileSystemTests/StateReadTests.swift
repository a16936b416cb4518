import Foundation
import GRDB
import GRDBSQLite
import TestSupport
import Testing
@testable import UbiqState

/// What a read of the state costs the statements cached beside it.
@Suite struct StateReadTests {
    /// A read leaves the connection's prepared statements as they are: GRDB's own read sets
    /// `PRAGMA query_only` on and off, which expires every prepared statement, so each cached
    /// statement was compiled again after every read (a third of a large listing's import).
    @Test func readsDoNotExpireCachedStatements() throws {
        let dir = TempPaths.make("ubiq-state-read")
        defer { try? FileManager.default.removeItem(at: dir) }
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let state = try LocalState(path: dir.appendingPathComponent("state.db").path)
        try state.write { try $0.setMeta("k", "v") }
        // The statement `meta` runs, from the connection's cache: how often SQLite compiled it
        // again, after a first read and after five more.
        let reprepared = {
            try state.dbQueue.unsafeRead { db in
                let statement = try db.cachedStatement(sql: "SELECT value FROM meta WHERE key = ?")
                return sqlite3_stmt_status(statement.sqliteStatement, SQLITE_STMTSTATUS_REPREPARE, 0)
            }
        }
        #expect(try state.read { try $0.meta("k") } == "v")
        let before = try reprepared()
        for _ in 0 ..< 5 {
            #expect(try state.read { try $0.meta("k") } == "v")
        }
        let after = try reprepared()
        #expect(after == before, "compiled again \(after - before) times in five reads")
    }

    /// Whether a folder's files not in memory hold a placeholder (its status: a folder with a
    /// file in the cloud under it is not `current`) comes out alike asked by number (a few
    /// hundred) and by reading the placeholders until the first of them (more).
    @Test func anyPlaceholderAmongFewOrMany() throws {
        let state = try LocalState()
        try state.write { tx in
            for i in UInt64(10) ..< 2010 {
                try tx.upsert(InodeRecord(ino: i, type: UInt32(S_IFREG), perm: 0o644, uid: 0, gid: 0, size: 1,
                                          atimeNs: 0, mtimeNs: 0, ctimeNs: 0, present: i != 1500))
            }
        }
        func any(_ inos: some Sequence<UInt64>) throws -> Bool { try state.read { try $0.anyPlaceholder(among: Set(inos)) } }
        #expect(try any(1400 ..< 1600) && any(10 ..< 2010) && any([1500]))
        #expect(try !any(10 ..< 1500) && !any(1501 ..< 2010) && !any([]) && !any([1, 2, 3]))
    }

    /// Of a set of keys, those recorded (an entry's key, or a tombstone's) come out alike
    /// whether their range is read at once (few others between them) or each is looked up
    /// (a range that holds many others); NFC and NFD spellings of a name are two keys.
    @Test func recordedKeysAmongOthers() throws {
        let state = try LocalState()
        let nfc = "caf\u{E9}", nfd = "cafe\u{301}"
        try state.write { tx in
            for i in 0 ..< 500 {
                try tx.insertEntry(parent: 1, name: Array("f\(i)".utf8), ino: UInt64(10 + i), remoteKey: String(format: "d/f%04d", i))
            }
            _ = try tx.addTombstone(key: "d/f0500", version: "v")
            try tx.insertEntry(parent: 1, name: Array(nfc.utf8), ino: 9, remoteKey: "e/" + nfc)
        }
        func recorded(_ keys: [String]) throws -> Set<[UInt8]> {
            let among = try state.read { try $0.recordedKeys(among: keys) }
            let asked = Set(keys.map { Array($0.utf8) })
            return Set(among.map { Array($0.utf8) }).intersection(asked)
        }
        let dense = (490 ..< 510).map { String(format: "d/f%04d", $0) }
        #expect(try recorded(dense) == Set((490 ... 500).map { Array(String(format: "d/f%04d", $0).utf8) }))
        // Two keys far apart, 499 recorded keys between them: each is looked up.
        let sparse = ["d/f0000", "d/f0499x", "d/f0500", "e/" + nfd]
        #expect(try recorded(sparse) == Set(["d/f0000", "d/f0500"].map { Array($0.utf8) }))
        #expect(try recorded(["e/" + nfd, "e/" + nfc]) == [Array(("e/" + nfc).utf8)])
        #expect(try recorded([]).isEmpty)
    }
}
