import Foundation
import GRDB

// What goes up: the outbox and the tombstones of objects to delete in the store.
extension StateTransaction {
    // MARK: outbox

    /// Queues `ino` for upload (coalesced: one row per inode), not before `delay` seconds.
    public func enqueue(_ ino: UInt64, delay: TimeInterval = 0) throws {
        try enqueue(ino, notBefore: now.timeIntervalSince1970 + delay)
    }

    /// Queues `ino` for upload, not before `notBefore` (seconds since 1970).
    public func enqueue(_ ino: UInt64, notBefore: Double) throws {
        try db.cachedStatement(sql: """
            INSERT INTO outbox (ino, seq, not_before) VALUES (?, (SELECT coalesce(max(seq), 0) + 1 FROM outbox), ?)
            ON CONFLICT (ino) DO UPDATE SET seq = excluded.seq, not_before = max(outbox.not_before, excluded.not_before)
            """).execute(arguments: [Int64(bitPattern: ino), notBefore])
    }

    public struct OutboxItem: Sendable { public var ino: UInt64; public var seq: Int64; public var attempts: Int }

    /// Items due now, oldest first.
    public func dueOutbox(limit: Int, asOf time: Date? = nil) throws -> [OutboxItem] {
        let now = time ?? self.now
        return try Row.fetchAll(db, cached: "SELECT ino, seq, attempts FROM outbox WHERE not_before <= ? ORDER BY seq LIMIT ?",
                         arguments: [now.timeIntervalSince1970, limit]).map {
            OutboxItem(ino: UInt64(bitPattern: $0[0]), seq: $0[1], attempts: $0[2])
        }
    }

    /// Removes the row only if it was not re-queued since `seq` was read.
    public func completeOutbox(_ ino: UInt64, seq: Int64) throws {
        try db.execute(cached: "DELETE FROM outbox WHERE ino = ? AND seq = ?", arguments: [Int64(bitPattern: ino), seq])
    }

    /// Puts `ino` back in the queue, due after `delay`; `attempt`: it was tried (the count the
    /// backoff grows with), not only found busy.
    public func retryOutbox(_ ino: UInt64, after delay: TimeInterval, attempt: Bool = true) throws {
        try db.execute(cached: """
            UPDATE outbox SET attempts = attempts + ?, not_before = ?,
              seq = (SELECT coalesce(max(seq), 0) + 1 FROM outbox) WHERE ino = ?
            """, arguments: [attempt ? 1 : 0, now.timeIntervalSince1970 + delay, Int64(bitPattern: ino)])
    }

    /// Inodes whose upload failed for good (kept locally, with the reason); ones still
    /// queued for another try are counted by `outboxCount`.
    public func uploadErrorCount() throws -> Int {
        try Int.fetchOne(db, cached: """
            SELECT count(*) FROM inodes WHERE upload_error IS NOT NULL AND ino NOT IN (SELECT ino FROM outbox)
            """) ?? 0
    }

    /// Inodes with changes waiting in the outbox.
    public func outboxInodes() throws -> Set<UInt64> {
        Set(try Int64.fetchAll(db, cached: "SELECT ino FROM outbox").map { UInt64(bitPattern: $0) })
    }

    /// Inodes whose last upload failed: why, and whether it was a conflict.
    public func uploadErrors() throws -> [UInt64: (error: String, conflict: Bool, localOnly: Bool)] {
        var out: [UInt64: (error: String, conflict: Bool, localOnly: Bool)] = [:]
        for r in try Row.fetchAll(db, cached: "SELECT ino, upload_error, upload_conflict FROM inodes WHERE upload_error IS NOT NULL") {
            let kind: Int = r[2]
            out[UInt64(bitPattern: r[0])] = (r[1], kind == 1, kind == 2)
        }
        return out
    }

    /// Inodes none of whose names is in the store yet (a partial index keeps this cheap:
    /// only items not uploaded are in it).
    public func inodesNotInStore() throws -> Set<UInt64> {
        Set(try Int64.fetchAll(db, cached: """
            SELECT DISTINCT e.ino FROM entries e INDEXED BY entries_not_in_store WHERE e.remote_key IS NULL
              AND NOT EXISTS (SELECT 1 FROM entries k WHERE k.ino = e.ino AND k.remote_key IS NOT NULL)
            """).map { UInt64(bitPattern: $0) })
    }

    /// Whether `ino` waits in the outbox.
    public func isQueued(_ ino: UInt64) throws -> Bool {
        try Bool.fetchOne(db, cached: "SELECT EXISTS (SELECT 1 FROM outbox WHERE ino = ?)", arguments: [Int64(bitPattern: ino)]) ?? false
    }

    public func outboxCount() throws -> Int {
        try Int.fetchOne(db, cached: "SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM tombstones)") ?? 0
    }

    // MARK: tombstones

    public struct Tombstone: Sendable {
        public var id: Int64; public var key: String; public var version: String?
        /// The version of a tombstone for where an upload went whose answer never came: it
        /// deletes only an object this device wrote that no item records.
        public static let leftover = "ubiq:unrecorded-upload"
        public var isLeftover: Bool { version == Self.leftover }
    }

    /// Notes that an upload of `ino` is being sent to `key`, which no entry of it records yet:
    /// should its answer never come and the item be removed, the key is checked (`removeEntry`).
    public func markSent(_ ino: UInt64, key: String) throws {
        try db.execute(cached: "UPDATE outbox SET sent_key = ? WHERE ino = ?", arguments: [key, Int64(bitPattern: ino)])
    }

    public func tombstones(limit: Int) throws -> [Tombstone] {
        try Row.fetchAll(db, cached: "SELECT id, remote_key, remote_version FROM tombstones ORDER BY id LIMIT ?",
                         arguments: [limit]).map { Tombstone(id: $0[0], key: $0[1], version: $0[2]) }
    }

    public func removeTombstone(_ id: Int64) throws {
        try db.execute(cached: "DELETE FROM tombstones WHERE id = ?", arguments: [id])
    }
}
