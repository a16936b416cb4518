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
}
