import Foundation
import GRDB

/// The statements of one transaction.
public struct StateTransaction {
    public let db: Database
    /// The state's time (`LocalState.time`) when the transaction began: what an upload's delay
    /// and a retry's wait count from.
    public let now: Date

    // MARK: meta

    public func meta(_ key: String) throws -> String? {
        try String.fetchOne(db, cached: "SELECT value FROM meta WHERE key = ?", arguments: [key])
    }

    public func setMeta(_ key: String, _ value: String) throws {
        try db.execute(cached: "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", arguments: [key, value])
    }

    // MARK: inodes

    /// A record's values for `inodeColumns`, in their order.
    private static func inodeValues(_ r: InodeRecord) -> StatementArguments {
        [Int64(bitPattern: r.ino), r.type, r.perm, r.uid, r.gid, r.size, r.atimeNs, r.mtimeNs, r.ctimeNs,
         Int64(bitPattern: r.rdev), r.target.map { Data($0) }, r.present, r.contentGen, r.metaGen, r.pinned]
    }

    public func upsert(_ r: InodeRecord) throws {
        try db.cachedStatement(sql: """
            INSERT INTO inodes (\(Self.inodeColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (ino) DO UPDATE SET type = excluded.type, perm = excluded.perm, uid = excluded.uid,
              gid = excluded.gid, size = excluded.size, atime = excluded.atime, mtime = excluded.mtime,
              ctime = excluded.ctime, rdev = excluded.rdev, target = excluded.target,
              present = excluded.present, content_gen = excluded.content_gen, meta_gen = excluded.meta_gen,
              pinned = excluded.pinned
            """).execute(arguments: Self.inodeValues(r))
    }

    /// A new inode, as the store has it: `upsert` and `markUploaded` of its generations in one
    /// statement (an import makes a million).
    public func insertUploaded(_ r: InodeRecord) throws {
        try db.cachedStatement(sql: """
            INSERT INTO inodes (\(Self.inodeColumns), uploaded_content_gen, uploaded_meta_gen)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """).execute(arguments: Self.inodeValues(r) + [r.contentGen, r.metaGen])
    }

    public func deleteInode(_ ino: UInt64) throws {
        let i = Int64(bitPattern: ino)
        try db.execute(cached: "DELETE FROM inodes WHERE ino = ?", arguments: [i])
        try db.execute(cached: "DELETE FROM xattrs WHERE ino = ?", arguments: [i])
        try db.execute(cached: "DELETE FROM outbox WHERE ino = ?", arguments: [i])
        // Its number is never given to another item (`maxInode`): a file handle names it.
        try db.execute(cached: """
            INSERT INTO meta (key, value) VALUES ('ino_high_water', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value
            WHERE CAST(excluded.value AS INTEGER) > CAST(meta.value AS INTEGER)
            """, arguments: [String(i)])
    }

    public func inode(_ ino: UInt64) throws -> InodeRecord? {
        try Row.fetchOne(db, cached: "SELECT \(Self.inodeColumns) FROM inodes WHERE ino = ?", arguments: [Int64(bitPattern: ino)])
            .map(Self.inodeRecord)
    }

    public func allInodes() throws -> [InodeRecord] {
        try Row.fetchAll(db, cached: "SELECT \(Self.inodeColumns) FROM inodes").map(Self.inodeRecord)
    }

    /// The columns `inodeRecord` reads, in its order (`prefix`: a table alias, "i.").
    static func inodeColumns(_ prefix: String) -> String {
        ["ino", "type", "perm", "uid", "gid", "size", "atime", "mtime", "ctime", "rdev", "target", "present",
         "content_gen", "meta_gen", "pinned"].map { prefix + $0 }.joined(separator: ", ")
    }
    static let inodeColumns = inodeColumns("")

    /// The record of a row that begins with `inodeColumns` (read by position: a name is looked
    /// up case-insensitively at every read, the most of a folder's read-in).
    static func inodeRecord(_ r: Row) -> InodeRecord {
        var rec = InodeRecord(ino: UInt64(bitPattern: r[0]), type: r[1], perm: r[2], uid: r[3],
                              gid: r[4], size: r[5], atimeNs: r[6], mtimeNs: r[7],
                              ctimeNs: r[8], rdev: UInt64(bitPattern: r[9]),
                              target: (r[10] as Data?).map { [UInt8]($0) }, present: r[11],
                              contentGen: r[12], metaGen: r[13])
        rec.pinned = r[14]
        return rec
    }

    /// True when every change to `ino` is in the store: nothing queued, last upload
    /// covered the current content and metadata, and it has a copy there.
    public func isUploaded(_ ino: UInt64) throws -> Bool {
        try Bool.fetchOne(db, cached: """
            SELECT i.uploaded_content_gen >= i.content_gen AND i.upload_error IS NULL
              AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.ino = i.ino)
              AND EXISTS (SELECT 1 FROM entries e WHERE e.ino = i.ino AND e.remote_key IS NOT NULL)
            FROM inodes i WHERE i.ino = ?
            """, arguments: [Int64(bitPattern: ino)]) ?? false
    }

    /// What of `ino` this device changed and has not uploaded: its content, its metadata,
    /// and whether anything (a name, too) waits in the outbox.
    public func localChanges(_ ino: UInt64) throws -> (content: Bool, metadata: Bool, queued: Bool) {
        guard let row = try Row.fetchOne(db, cached: """
            SELECT i.uploaded_content_gen < i.content_gen, i.uploaded_meta_gen < i.meta_gen,
                   EXISTS (SELECT 1 FROM outbox o WHERE o.ino = i.ino)
            FROM inodes i WHERE i.ino = ?
            """, arguments: [Int64(bitPattern: ino)]) else { return (false, false, false) }
        return (row[0], row[1], row[2])
    }

    /// Whether `ino` changed here since the store last had it: its content, its metadata, or
    /// something queued for it (a new name).
    public func isChangedHere(_ ino: UInt64) throws -> Bool {
        let local = try localChanges(ino)
        return local.content || local.metadata || local.queued
    }

    /// Replaces every extended attribute of `ino`.
    public func replaceXattrs(_ ino: UInt64, _ attrs: [[UInt8]: [UInt8]]) throws {
        try db.execute(cached: "DELETE FROM xattrs WHERE ino = ?", arguments: [Int64(bitPattern: ino)])
        for (k, v) in attrs { try setXattr(ino, name: k, value: v) }
    }

    public func uploadState(_ ino: UInt64) throws -> UploadState? {
        try Row.fetchOne(db, cached: """
            SELECT uploaded_content_gen, uploaded_meta_gen, upload_error, upload_conflict FROM inodes WHERE ino = ?
            """, arguments: [Int64(bitPattern: ino)]).map {
            let kind: Int = $0[3]
            return UploadState(uploadedContentGen: $0[0], uploadedMetaGen: $0[1], error: $0[2], conflict: kind == 1, localOnly: kind == 2)
        }
    }

    public func markUploaded(_ ino: UInt64, contentGen: Int64, metaGen: Int64) throws {
        try db.execute(cached: """
            UPDATE inodes SET uploaded_content_gen = max(uploaded_content_gen, ?),
              uploaded_meta_gen = max(uploaded_meta_gen, ?), upload_error = NULL, upload_conflict = 0 WHERE ino = ?
            """, arguments: [contentGen, metaGen, Int64(bitPattern: ino)])
    }

    /// Records why the last upload of `ino` failed (nil: it did not); `conflict`: because the
    /// store has another device's newer version; `localOnly`: it is kept on this device by design
    /// (`upload_conflict` holds 0, 1 for a conflict, 2 for local only).
    public func setUploadError(_ ino: UInt64, _ error: String?, conflict: Bool = false, localOnly: Bool = false) throws {
        let kind = error == nil ? 0 : (conflict ? 1 : (localOnly ? 2 : 0))
        try db.execute(cached: "UPDATE inodes SET upload_error = ?, upload_conflict = ? WHERE ino = ?",
                       arguments: [error, kind, Int64(bitPattern: ino)])
    }

    /// The highest inode number ever given, here or to an item since removed: new items
    /// take numbers past it, so a number (a kernel's file handle, `name_to_handle_at`) never
    /// comes to stand for another item, across remounts too.
    public func maxInode() throws -> Int64 {
        try Int64.fetchOne(db, cached: """
            SELECT max(coalesce((SELECT max(ino) FROM inodes), 1),
                       coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'ino_high_water'), 1))
            """) ?? 1
    }

    // MARK: xattrs

    public func setXattr(_ ino: UInt64, name: [UInt8], value: [UInt8]) throws {
        try db.execute(cached: "INSERT OR REPLACE INTO xattrs (ino, name, value) VALUES (?, ?, ?)",
                       arguments: [Int64(bitPattern: ino), Data(name), Data(value)])
    }

    public func removeXattr(_ ino: UInt64, name: [UInt8]) throws {
        try db.execute(cached: "DELETE FROM xattrs WHERE ino = ? AND name = ?", arguments: [Int64(bitPattern: ino), Data(name)])
    }

    public func xattrs(_ ino: UInt64) throws -> [[UInt8]: [UInt8]] {
        var out: [[UInt8]: [UInt8]] = [:]
        for r in try Row.fetchAll(db, cached: "SELECT name, value FROM xattrs WHERE ino = ?", arguments: [Int64(bitPattern: ino)]) {
            out[[UInt8](r["name"] as Data)] = [UInt8](r["value"] as Data)
        }
        return out
    }
}

// Statements the state runs again and again are prepared once per connection: preparing
// costs more than running them (GRDB's authorizer inspects every column read).
extension Row {
    static func fetchOne(_ db: Database, cached sql: String, arguments: StatementArguments = StatementArguments()) throws -> Row? {
        try fetchOne(db.cachedStatement(sql: sql), arguments: arguments)
    }
    static func fetchAll(_ db: Database, cached sql: String, arguments: StatementArguments = StatementArguments()) throws -> [Row] {
        try fetchAll(db.cachedStatement(sql: sql), arguments: arguments)
    }
}

extension DatabaseValueConvertible where Self: StatementColumnConvertible {
    static func fetchOne(_ db: Database, cached sql: String, arguments: StatementArguments = StatementArguments()) throws -> Self? {
        try fetchOne(db.cachedStatement(sql: sql), arguments: arguments)
    }
    static func fetchAll(_ db: Database, cached sql: String, arguments: StatementArguments = StatementArguments()) throws -> [Self] {
        try fetchAll(db.cachedStatement(sql: sql), arguments: arguments)
    }
}

extension Database {
    func execute(cached sql: String, arguments: StatementArguments = StatementArguments()) throws {
        try cachedStatement(sql: sql).execute(arguments: arguments)
    }
}
