import Foundation
import GRDB

// Names (entries) and where each is in the store.
extension StateTransaction {
    // MARK: entries

    public func insertEntry(parent: UInt64, name: [UInt8], ino: UInt64,
                            remoteKey: String? = nil, remoteVersion: String? = nil, remoteTag: String? = nil,
                            remoteDigest: String? = nil, remoteFileID: String? = nil) throws {
        try db.cachedStatement(sql: """
            INSERT INTO entries (parent, name, ino, remote_key, remote_version, remote_tag, remote_digest, remote_file_id)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """).execute(arguments: [Int64(bitPattern: parent), Data(name), Int64(bitPattern: ino), remoteKey,
                                     remoteVersion, remoteTag, remoteDigest, remoteFileID])
    }

    /// Removes an entry; if its object is in the store, records a tombstone so
    /// the uploader deletes it there. Where an upload of it went without an answer (`markSent`)
    /// gets a tombstone too, which deletes only an object of this device that no item records
    /// (`Tombstone.leftover`).
    public func removeEntry(parent: UInt64, name: [UInt8]) throws {
        let args: StatementArguments = [Int64(bitPattern: parent), Data(name)]
        try db.cachedStatement(sql: """
            INSERT INTO tombstones (remote_key, remote_version)
            SELECT remote_key, remote_version FROM entries WHERE parent = ? AND name = ? AND remote_key IS NOT NULL
            """).execute(arguments: args)
        try db.cachedStatement(sql: """
            INSERT INTO tombstones (remote_key, remote_version)
            SELECT o.sent_key, '\(Tombstone.leftover)' FROM entries e JOIN outbox o ON o.ino = e.ino
            WHERE e.parent = ? AND e.name = ? AND o.sent_key IS NOT NULL AND o.sent_key IS NOT e.remote_key
            """).execute(arguments: args)
        try db.cachedStatement(sql: "DELETE FROM entries WHERE parent = ? AND name = ?").execute(arguments: args)
    }

    /// Entry `id` now names inode `ino` (a hard link's name leaving the link), its store
    /// mapping kept.
    public func relinkEntry(id: Int64, to ino: UInt64) throws {
        try db.execute(cached: "UPDATE entries SET ino = ? WHERE id = ?", arguments: [Int64(bitPattern: ino), id])
    }

    public func moveEntry(parent: UInt64, name: [UInt8], toParent: UInt64, toName: [UInt8]) throws {
        try db.cachedStatement(sql: "UPDATE entries SET parent = ?, name = ? WHERE parent = ? AND name = ?")
            .execute(arguments: [Int64(bitPattern: toParent), Data(toName), Int64(bitPattern: parent), Data(name)])
    }

    /// Swaps the inodes (and store mappings) of two entries, for RENAME_EXCHANGE.
    public func exchangeEntries(_ a: (UInt64, [UInt8]), _ b: (UInt64, [UInt8])) throws {
        // Move a out of the way through a name no real entry can have (contains '/').
        let tmp: [UInt8] = Array("/exchange".utf8)
        try moveEntry(parent: a.0, name: a.1, toParent: a.0, toName: tmp)
        try moveEntry(parent: b.0, name: b.1, toParent: a.0, toName: a.1)
        try moveEntry(parent: a.0, name: tmp, toParent: b.0, toName: b.1)
    }

    public func allEntries() throws -> [EntryRecord] {
        try Row.fetchAll(db, cached: "SELECT * FROM entries").map(Self.entryRecord)
    }

    public func entries(of ino: UInt64) throws -> [EntryRecord] {
        try Row.fetchAll(db, cached: "SELECT * FROM entries WHERE ino = ?", arguments: [Int64(bitPattern: ino)])
            .map(Self.entryRecord)
    }

    /// The entry at the path of `parts` (names from the root), or nil.
    public func entry(atPath parts: some Sequence<String>) throws -> EntryRecord? {
        var parent: UInt64 = 1
        var found: EntryRecord?
        for seg in parts {
            guard let e = try entry(parent: parent, name: Array(seg.utf8)) else { return nil }
            found = e
            parent = e.ino
        }
        return found
    }

    public func entry(parent: UInt64, name: [UInt8]) throws -> EntryRecord? {
        try Row.fetchOne(db, cached: "SELECT * FROM entries WHERE parent = ? AND name = ?",
                         arguments: [Int64(bitPattern: parent), Data(name)]).map(Self.entryRecord)
    }

    /// The entry (if any) whose object sits at `key` in the store.
    public func entries(remoteKey key: String) throws -> [EntryRecord] {
        try Row.fetchAll(db, cached: "SELECT * FROM entries WHERE remote_key = ?", arguments: [key]).map(Self.entryRecord)
    }

    /// Entries whose recorded version holds these bytes, by the store's content tag or the
    /// digest (either may be nil), at most `limit`: those named `name` first.
    public func entries(tag: String?, digest: String?, name: [UInt8], limit: Int) throws -> [EntryRecord] {
        guard tag != nil || digest != nil else { return [] }
        let named = try Row.fetchAll(db, cached: """
            SELECT * FROM entries WHERE remote_tag = ? AND name = ?
            UNION SELECT * FROM entries WHERE remote_digest = ? AND name = ? LIMIT ?
            """, arguments: [tag, Data(name), digest, Data(name), limit]).map(Self.entryRecord)
        if !named.isEmpty { return named }
        return try Row.fetchAll(db, cached: "SELECT * FROM entries WHERE remote_tag = ? OR remote_digest = ? LIMIT ?",
                                arguments: [tag, digest, limit]).map(Self.entryRecord)
    }

    /// Entries whose recorded version carried the item id `fileID`, at most `limit`.
    public func entries(fileID: String, limit: Int) throws -> [EntryRecord] {
        try Row.fetchAll(db, cached: "SELECT * FROM entries WHERE remote_file_id = ? LIMIT ?", arguments: [fileID, limit])
            .map(Self.entryRecord)
    }

    /// What an entry records of its store object that other items are found by (`entries(fileID:)`,
    /// `entries(tag:digest:name:)`).
    public enum RecordedValue: String {
        case fileID = "remote_file_id", tag = "remote_tag", digest = "remote_digest"
    }

    /// Of `values`, those some entry records as `what`, a few hundred a read: most new items
    /// of a large listing are held by nothing here, and asking for each alone was a sixth of
    /// its import. (Text compared as SQLite does, byte for byte; the set only says which
    /// values are worth a lookup.)
    public func recorded(_ what: RecordedValue, among values: [String]) throws -> Set<String> {
        Set(try inChunks(values) { "SELECT DISTINCT \(what.rawValue) FROM entries WHERE \(what.rawValue) IN (\($0))" })
    }

    /// Whether more than `count` entries record `value` as `what` (at most `count` + 1 rows read).
    public func recorded(_ what: RecordedValue, _ value: String, byMoreThan count: Int) throws -> Bool {
        let n = try Int.fetchOne(db, sql: "SELECT count(*) FROM (SELECT 1 FROM entries WHERE \(what.rawValue) = ? LIMIT ?)",
                                 arguments: [value, count + 1]) ?? 0
        return n > count
    }

    /// What `sql` reads for `values`, 500 at a time: `sql` is given the placeholders of a
    /// chunk's values, each of its `lists` lists of them gets the chunk's values.
    private func inChunks(_ values: [String], lists: Int = 1, _ sql: (String) -> String) throws -> [String] {
        var out: [String] = []
        var start = 0
        while start < values.count {
            let chunk = Array(values[start ..< min(values.count, start + 500)])
            start += chunk.count
            let marks = Array(repeating: "?", count: chunk.count).joined(separator: ",")
            out += try String.fetchAll(db, sql: sql(marks), arguments: StatementArguments(Array(repeating: chunk, count: lists).joined()))
        }
        return out
    }

    public func children(of parent: UInt64) throws -> [EntryRecord] {
        try Row.fetchAll(db, cached: "SELECT * FROM entries WHERE parent = ?", arguments: [Int64(bitPattern: parent)])
            .map(Self.entryRecord)
    }

    public func setRemote(entryID: Int64, key: String?, version: String?, tag: String? = nil, digest: String? = nil) throws {
        try db.execute(cached: "UPDATE entries SET remote_key = ?, remote_version = ?, remote_tag = ?, remote_digest = ? WHERE id = ?",
                       arguments: [key, version, tag, digest, entryID])
    }

    /// Records that entry `entryID`'s object now sits at `key`@`version`. If the
    /// entry was removed meanwhile, the object is an orphan: a tombstone deletes it. A version
    /// that carries no item id (`fileID`: another tool's) leaves the one recorded.
    public func recordRemote(entryID: Int64, key: String, version: String, tag: String? = nil, digest: String? = nil,
                             fileID: String? = nil) throws {
        try db.execute(cached: """
            UPDATE entries SET remote_key = ?, remote_version = ?, remote_tag = ?, remote_digest = ?,
            remote_file_id = COALESCE(?, remote_file_id) WHERE id = ?
            """, arguments: [key, version, tag, digest, fileID, entryID])
        if db.changesCount == 0 { try addTombstone(key: key, version: version) }
    }

    /// Returns the tombstone's id.
    @discardableResult
    public func addTombstone(key: String, version: String?) throws -> Int64 {
        try db.execute(cached: "INSERT INTO tombstones (remote_key, remote_version) VALUES (?, ?)", arguments: [key, version])
        return db.lastInsertedRowID
    }

    public func hasTombstone(key: String) throws -> Bool {
        try Bool.fetchOne(db, cached: "SELECT EXISTS (SELECT 1 FROM tombstones WHERE remote_key = ?)", arguments: [key]) ?? false
    }

    // Keys come out as lists, not String sets or dictionaries: a String compares by canonical
    // equivalence, and NFC and NFD spellings of one name are two keys (callers use KeyBytes).

    public func tombstoneKeys() throws -> [String] {
        try String.fetchAll(db, cached: "SELECT remote_key FROM tombstones")
    }

    /// Of `keys`, those an entry stands for or a tombstone waits to delete (what a page of the
    /// store's listing, or of its changes, leaves to the slower paths), with others between
    /// them perhaps: callers ask of each key whether it is among them. One reading of the
    /// keys' range (in byte order) where it holds few others, else the keys asked for a few
    /// hundred at a read: a check a key was two lookups, a tenth of a large listing's import.
    public func recordedKeys(among keys: [String]) throws -> [String] {
        let byBytes = { (a: String, b: String) in a.utf8.lexicographicallyPrecedes(b.utf8) }
        guard let low = keys.min(by: byBytes), let high = keys.max(by: byBytes) else { return [] }
        let most = keys.count * 4 + 64
        let inRange = try String.fetchAll(db, cached: """
            SELECT remote_key FROM entries WHERE remote_key >= ?1 AND remote_key <= ?2
            UNION ALL SELECT remote_key FROM tombstones WHERE remote_key >= ?1 AND remote_key <= ?2
            LIMIT ?3
            """, arguments: [low, high, most + 1])
        if inRange.count <= most { return inRange }
        return try inChunks(keys, lists: 2) {
            "SELECT remote_key FROM entries WHERE remote_key IN (\($0)) UNION ALL SELECT remote_key FROM tombstones WHERE remote_key IN (\($0))"
        }
    }

    // MARK: what a full comparison with the store weighs (a reset of the change feed)

    /// Sets every store key an entry stands for, with the version recorded for it, aside in a
    /// table of the database connection's own (SQLite's temporary database: on disk past its
    /// small cache, gone when the connection closes), as of now: what this device recorded
    /// before a full listing of the store began, weighed against the listing a page at a time
    /// (`markListed`, `heldUnlisted`). A million keys held in memory were a GB.
    public func holdRecordedVersions() throws {
        try db.execute(sql: """
            CREATE TEMP TABLE IF NOT EXISTS held_versions (key TEXT PRIMARY KEY, version TEXT NOT NULL,
                                                           listed INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
            DELETE FROM temp.held_versions;
            INSERT OR REPLACE INTO temp.held_versions (key, version)
              SELECT remote_key, remote_version FROM entries
              WHERE remote_key IS NOT NULL AND remote_version IS NOT NULL ORDER BY remote_key
            """)
    }

    /// Of `keys` (a page of a listing), the version held for each (nil: none held), each now
    /// marked as listed.
    public func markListed(_ keys: [String]) throws -> [String?] {
        let read = try db.cachedStatement(sql: "SELECT version FROM temp.held_versions WHERE key = ?")
        let mark = try db.cachedStatement(sql: "UPDATE temp.held_versions SET listed = 1 WHERE key = ?")
        return try keys.map { key in
            guard let v = try String.fetchOne(read, arguments: [key]) else { return nil }
            try mark.execute(arguments: [key])
            return v
        }
    }

    /// The keys held that no listing marked (gone from the store, unless recorded since), in
    /// byte order, with their versions.
    public func heldUnlisted() throws -> [(key: String, version: String)] {
        try Row.fetchAll(db, sql: "SELECT key, version FROM temp.held_versions WHERE listed = 0 ORDER BY key")
            .map { ($0[0], $0[1]) }
    }

    /// Every held key unmarked again (a listing that failed half way is made again).
    public func unmarkListed() throws {
        try db.execute(sql: "UPDATE temp.held_versions SET listed = 0 WHERE listed = 1")
    }

    /// The held keys let go.
    public func releaseHeldVersions() throws {
        try db.execute(sql: "DROP TABLE IF EXISTS temp.held_versions")
    }

    static func entryRecord(_ r: Row) -> EntryRecord {
        EntryRecord(id: r["id"], parent: UInt64(bitPattern: r["parent"]), name: [UInt8](r["name"] as Data),
                    ino: UInt64(bitPattern: r["ino"]), remoteKey: r["remote_key"], remoteVersion: r["remote_version"],
                    remoteTag: r["remote_tag"], remoteDigest: r["remote_digest"], remoteFileID: r["remote_file_id"])
    }
}
