import Foundation
import GRDB
import Synchronization

/// The wall clock, nanoseconds since the epoch (file times).
public func nowNanos() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

/// One inode as the device remembers it.
public struct InodeRecord: Sendable, Equatable {
    public var ino: UInt64
    /// File type, as `st_mode & S_IFMT`.
    public var type: UInt32
    /// Permission bits, the low 12 bits of `st_mode`.
    public var perm: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var size: Int64
    public var atimeNs: Int64
    public var mtimeNs: Int64
    public var ctimeNs: Int64
    public var rdev: UInt64
    public var target: [UInt8]?
    /// The content is in the cache (false: a placeholder).
    public var present: Bool
    /// Bumped on every content change; the upload records the one it sent.
    public var contentGen: Int64
    /// Bumped on every metadata change (mode, owner, times, xattrs).
    public var metaGen: Int64
    /// "Keep downloaded": fetched ahead, never evicted (on a folder: everything under it).
    public var pinned: Bool = false

    public init(ino: UInt64, type: UInt32, perm: UInt32, uid: UInt32, gid: UInt32, size: Int64 = 0,
                atimeNs: Int64, mtimeNs: Int64, ctimeNs: Int64, rdev: UInt64 = 0, target: [UInt8]? = nil,
                present: Bool = true, contentGen: Int64 = 1, metaGen: Int64 = 1) {
        self.ino = ino; self.type = type; self.perm = perm; self.uid = uid; self.gid = gid
        self.size = size; self.atimeNs = atimeNs; self.mtimeNs = mtimeNs; self.ctimeNs = ctimeNs
        self.rdev = rdev; self.target = target; self.present = present
        self.contentGen = contentGen; self.metaGen = metaGen
    }
}

/// One name of an inode in a directory, and where it lives in the store.
public struct EntryRecord: Sendable, Equatable {
    public var id: Int64
    public var parent: UInt64
    public var name: [UInt8]
    public var ino: UInt64
    /// The key this entry's object has in the store (nil: never uploaded).
    public var remoteKey: String?
    public var remoteVersion: String?
    /// The store's content tag of that version (see `ObjectInfo.contentTag`).
    public var remoteTag: String? = nil
    /// The SHA-256 written beside that version's bytes (`ObjectMetadata.sha256`): a download
    /// of it is checked against this.
    public var remoteDigest: String? = nil
}

/// What the uploader has yet to do for an inode.
public struct UploadState: Sendable, Equatable {
    public var uploadedContentGen: Int64
    public var uploadedMetaGen: Int64
    public var error: String?
    /// The last upload met another device's newer version (the error says which).
    public var conflict = false
    /// Kept on this device only, by design (a name the store cannot hold; the error says why).
    public var localOnly = false
}

public enum StateError: Error, CustomStringConvertible {
    case database(String)
    /// The disk under the database is full, and its reserve is spent.
    case full(String)
    public var description: String {
        switch self {
        case .database(let s): return "state database: \(s)"
        case .full(let s): return "state database: the disk is full (\(s))"
        }
    }
}

/// The device's truth: a SQLite database (WAL) of inodes, names, xattrs,
/// the outbox and cursors. `synchronous = NORMAL` makes every commit survive
/// a killed process; `syncToDisk()` makes everything committed so far survive
/// a power loss too (it fsyncs the WAL), and is called by close/fsync.
public final class LocalState: Sendable {
    public let path: String
    /// Space kept on the disk for this database's commits (DiskReserve).
    public let reserve: DiskReserve
    private let dbQueue: DatabaseQueue
    private let walFD: Int32

    /// Opens (creating and migrating) the database at `path`. `exclusive`: this
    /// process is the only one to open it until it closes it (the daemon). `freeBytes`: the
    /// free space of its disk, for the reserve (tests give a disk of their own).
    public init(path: String, exclusive: Bool = false,
                freeBytes: @escaping @Sendable (String) -> Int64? = DiskReserve.freeBytes(at:)) throws {
        self.path = path
        reserve = DiskReserve(path: path + ".reserve", bytes: Self.reserveBytes, freeBytes: freeBytes)
        var config = Configuration()
        config.busyMode = .timeout(5)
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            // Only the daemon holding the state lock opens this database: no need for
            // SQLite's per-transaction file locks.
            if exclusive { _ = try String.fetchOne(db, sql: "PRAGMA locking_mode = EXCLUSIVE") }
        }
        // The owner's alone, its -wal and -shm too (SQLite gives them the database file's mode).
        if access(path, F_OK) != 0 { close(open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)) }
        for f in [path, path + "-wal", path + "-shm"] { chmod(f, 0o600) }
        do {
            dbQueue = try DatabaseQueue(path: path, configuration: config)
            try dbQueue.writeWithoutTransaction { db in
                _ = try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL")
            }
            try Self.migrator.migrate(dbQueue)
        } catch {
            throw StateError.database("cannot open \(path): \(error)")
        }
        walFD = open(path + "-wal", O_RDONLY | O_CLOEXEC)
        for f in [path, path + "-wal", path + "-shm"] { chmod(f, 0o600) }
    }

    deinit { if walFD >= 0 { close(walFD) } }

    /// An in-memory database, for tests.
    public init() throws {
        path = ":memory:"
        reserve = DiskReserve(path: nil)
        dbQueue = try DatabaseQueue()
        try Self.migrator.migrate(dbQueue)
        walFD = -1
    }

    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE inodes (
                  ino INTEGER PRIMARY KEY, type INTEGER NOT NULL, perm INTEGER NOT NULL,
                  uid INTEGER NOT NULL, gid INTEGER NOT NULL, size INTEGER NOT NULL,
                  atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL,
                  rdev INTEGER NOT NULL, target BLOB, present INTEGER NOT NULL,
                  content_gen INTEGER NOT NULL, meta_gen INTEGER NOT NULL,
                  uploaded_content_gen INTEGER NOT NULL DEFAULT 0,
                  uploaded_meta_gen INTEGER NOT NULL DEFAULT 0,
                  upload_error TEXT);
                CREATE TABLE entries (
                  id INTEGER PRIMARY KEY, parent INTEGER NOT NULL, name BLOB NOT NULL,
                  ino INTEGER NOT NULL, remote_key TEXT, remote_version TEXT,
                  UNIQUE (parent, name));
                CREATE INDEX entries_ino ON entries (ino);
                CREATE INDEX entries_remote ON entries (remote_key);
                CREATE TABLE xattrs (ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
                  PRIMARY KEY (ino, name));
                CREATE TABLE outbox (ino INTEGER PRIMARY KEY, seq INTEGER NOT NULL,
                  not_before REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0);
                CREATE TABLE tombstones (id INTEGER PRIMARY KEY, remote_key TEXT NOT NULL,
                  remote_version TEXT);
                """)
        }
        m.registerMigration("v2: indexes for tombstones and outbox order") { db in
            try db.execute(sql: """
                CREATE INDEX tombstones_key ON tombstones (remote_key);
                CREATE INDEX outbox_seq ON outbox (seq);
                DROP INDEX entries_remote;
                """)
        }
        m.registerMigration("v3: pins") { db in
            try db.execute(sql: "ALTER TABLE inodes ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")
        }
        m.registerMigration("v4: partial downloads") { db in
            try db.execute(sql: """
                CREATE TABLE downloads (ino INTEGER PRIMARY KEY, version TEXT NOT NULL,
                  chunk_size INTEGER NOT NULL, chunks BLOB NOT NULL)
                """)
        }
        m.registerMigration("v5: change feed") { db in
            try db.execute(sql: """
                ALTER TABLE entries ADD COLUMN remote_tag TEXT;
                CREATE INDEX entries_remote_key ON entries (remote_key) WHERE remote_key IS NOT NULL;
                CREATE TABLE feed_pending (key TEXT PRIMARY KEY);
                """)
        }
        m.registerMigration("v6: conflicts as a column; indexes for status summaries") { db in
            try db.execute(sql: """
                ALTER TABLE inodes ADD COLUMN upload_conflict INTEGER NOT NULL DEFAULT 0;
                UPDATE inodes SET upload_conflict = 1, upload_error = substr(upload_error, 11)
                  WHERE upload_error LIKE 'conflict: %';
                CREATE INDEX inodes_upload_errors ON inodes (ino) WHERE upload_error IS NOT NULL;
                CREATE INDEX entries_not_in_store ON entries (ino) WHERE remote_key IS NULL;
                """)
        }
        m.registerMigration("v7: key-value store") { db in
            try db.execute(sql: """
                CREATE TABLE kv (key TEXT PRIMARY KEY, doc BLOB NOT NULL, pending INTEGER NOT NULL DEFAULT 0);
                """)
        }
        m.registerMigration("v8: content digests") { db in
            try db.execute(sql: "ALTER TABLE entries ADD COLUMN remote_digest TEXT")
        }
        m.registerMigration("v9: where an unrecorded upload went") { db in
            try db.execute(sql: "ALTER TABLE outbox ADD COLUMN sent_key TEXT")
        }
        return m
    }

    // MARK: - Transactions

    /// Runs `body` in one write transaction. A disk too full for it, even after the reserve
    /// was given up, is `StateError.full`.
    public func write<T>(_ body: (StateTransaction) throws -> T) throws -> T {
        do {
            return try dbQueue.write { db in try body(StateTransaction(db: db)) }
        } catch let e as DatabaseError where e.resultCode == .SQLITE_FULL {
            // The disk is full: the reserve makes room for this commit (and the next few).
            guard reserve.release() else { throw StateError.full("\(e)") }
            do { return try dbQueue.write { db in try body(StateTransaction(db: db)) } } catch let e as DatabaseError where e.resultCode == .SQLITE_FULL {
                throw StateError.full("\(e)")
            } catch {
                throw StateError.database("\(error)")
            }
        } catch let e as StateError { throw e } catch {
            throw StateError.database("\(error)")
        }
    }

    /// Space held beside the database so that it can still commit when the disk fills up.
    public static let reserveBytes: Int64 = 8 << 20

    public func read<T>(_ body: (StateTransaction) throws -> T) throws -> T {
        do {
            return try dbQueue.read { db in try body(StateTransaction(db: db)) }
        } catch let e as DatabaseError {
            throw StateError.database("\(e)")
        }
        // Anything else the body threw is its own answer, and passes as it is.
    }

    /// Makes every committed transaction durable against power loss.
    public func syncToDisk() {
        syncs.withLock { $0 += 1 }
        if walFD >= 0 { _ = fdatasync(walFD) }
    }

    /// How many times `syncToDisk` ran (what tests of the durability contract count).
    public var syncCount: Int { syncs.withLock { $0 } }
    private let syncs = Mutex(0)
}

/// The statements of one transaction.
public struct StateTransaction {
    public let db: Database

    // MARK: meta

    public func meta(_ key: String) throws -> String? {
        try String.fetchOne(db, cached: "SELECT value FROM meta WHERE key = ?", arguments: [key])
    }

    public func setMeta(_ key: String, _ value: String) throws {
        try db.execute(cached: "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", arguments: [key, value])
    }

    // MARK: inodes

    public func upsert(_ r: InodeRecord) throws {
        try db.cachedStatement(sql: """
            INSERT INTO inodes (ino, type, perm, uid, gid, size, atime, mtime, ctime, rdev, target, present,
                                content_gen, meta_gen, pinned)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (ino) DO UPDATE SET type = excluded.type, perm = excluded.perm, uid = excluded.uid,
              gid = excluded.gid, size = excluded.size, atime = excluded.atime, mtime = excluded.mtime,
              ctime = excluded.ctime, rdev = excluded.rdev, target = excluded.target,
              present = excluded.present, content_gen = excluded.content_gen, meta_gen = excluded.meta_gen,
              pinned = excluded.pinned
            """).execute(arguments: [Int64(bitPattern: r.ino), r.type, r.perm, r.uid, r.gid, r.size, r.atimeNs,
                                     r.mtimeNs, r.ctimeNs, Int64(bitPattern: r.rdev), r.target.map { Data($0) },
                                     r.present, r.contentGen, r.metaGen, r.pinned])
    }

    public func deleteInode(_ ino: UInt64) throws {
        let i = Int64(bitPattern: ino)
        try db.execute(cached: "DELETE FROM inodes WHERE ino = ?", arguments: [i])
        try db.execute(cached: "DELETE FROM xattrs WHERE ino = ?", arguments: [i])
        try db.execute(cached: "DELETE FROM outbox WHERE ino = ?", arguments: [i])
    }

    public func inode(_ ino: UInt64) throws -> InodeRecord? {
        try Row.fetchOne(db, cached: "SELECT * FROM inodes WHERE ino = ?", arguments: [Int64(bitPattern: ino)])
            .map(Self.inodeRecord)
    }

    public func allInodes() throws -> [InodeRecord] {
        try Row.fetchAll(db, cached: "SELECT * FROM inodes").map(Self.inodeRecord)
    }

    static func inodeRecord(_ r: Row) -> InodeRecord {
        var rec = InodeRecord(ino: UInt64(bitPattern: r["ino"]), type: r["type"], perm: r["perm"], uid: r["uid"],
                              gid: r["gid"], size: r["size"], atimeNs: r["atime"], mtimeNs: r["mtime"],
                              ctimeNs: r["ctime"], rdev: UInt64(bitPattern: r["rdev"]),
                              target: (r["target"] as Data?).map { [UInt8]($0) }, present: r["present"],
                              contentGen: r["content_gen"], metaGen: r["meta_gen"])
        rec.pinned = r["pinned"]
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

    public func maxInode() throws -> Int64 {
        try Int64.fetchOne(db, cached: "SELECT coalesce(max(ino), 1) FROM inodes") ?? 1
    }


    // MARK: entries

    public func insertEntry(parent: UInt64, name: [UInt8], ino: UInt64,
                            remoteKey: String? = nil, remoteVersion: String? = nil, remoteTag: String? = nil,
                            remoteDigest: String? = nil) throws {
        try db.cachedStatement(sql: """
            INSERT INTO entries (parent, name, ino, remote_key, remote_version, remote_tag, remote_digest)
            VALUES (?, ?, ?, ?, ?, ?, ?)
            """).execute(arguments: [Int64(bitPattern: parent), Data(name), Int64(bitPattern: ino), remoteKey,
                                     remoteVersion, remoteTag, remoteDigest])
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

    public func entry(parent: UInt64, name: [UInt8]) throws -> EntryRecord? {
        try Row.fetchOne(db, cached: "SELECT * FROM entries WHERE parent = ? AND name = ?",
                         arguments: [Int64(bitPattern: parent), Data(name)]).map(Self.entryRecord)
    }

    /// The entry (if any) whose object sits at `key` in the store.
    public func entries(remoteKey key: String) throws -> [EntryRecord] {
        try Row.fetchAll(db, cached: "SELECT * FROM entries WHERE remote_key = ?", arguments: [key]).map(Self.entryRecord)
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
    /// entry was removed meanwhile, the object is an orphan: a tombstone deletes it.
    public func recordRemote(entryID: Int64, key: String, version: String, tag: String? = nil, digest: String? = nil) throws {
        try db.execute(cached: "UPDATE entries SET remote_key = ?, remote_version = ?, remote_tag = ?, remote_digest = ? WHERE id = ?",
                       arguments: [key, version, tag, digest, entryID])
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

    public func remoteKeys() throws -> [String] {
        try String.fetchAll(db, cached: "SELECT remote_key FROM entries WHERE remote_key IS NOT NULL")
    }

    /// Every store key an entry stands for, with the version recorded for it.
    public func remoteVersions() throws -> [(key: String, version: String)] {
        try Row.fetchAll(db, cached: "SELECT remote_key, remote_version FROM entries WHERE remote_key IS NOT NULL AND remote_version IS NOT NULL")
            .map { ($0[0], $0[1]) }
    }

    static func entryRecord(_ r: Row) -> EntryRecord {
        EntryRecord(id: r["id"], parent: UInt64(bitPattern: r["parent"]), name: [UInt8](r["name"] as Data),
                    ino: UInt64(bitPattern: r["ino"]), remoteKey: r["remote_key"], remoteVersion: r["remote_version"],
                    remoteTag: r["remote_tag"], remoteDigest: r["remote_digest"])
    }

    // MARK: the change feed

    /// Keys whose remote change waits (a reader has the file open, say); applied later.
    public func feedPending() throws -> [String] {
        try String.fetchAll(db, cached: "SELECT key FROM feed_pending ORDER BY key")
    }

    public func setFeedPending(_ keys: some Sequence<String>) throws {
        try db.execute(cached: "DELETE FROM feed_pending")
        for k in keys { try db.execute(cached: "INSERT INTO feed_pending (key) VALUES (?)", arguments: [k]) }
    }

    // MARK: the key-value store

    /// Every key's entry as stored (JSON), and whether it waits to go to the store.
    public func kvAll() throws -> [(key: String, doc: Data, pending: Bool)] {
        try Row.fetchAll(db, cached: "SELECT key, doc, pending FROM kv ORDER BY key").map { ($0["key"], $0["doc"], $0["pending"]) }
    }

    public func kvEntry(_ key: String) throws -> (doc: Data, pending: Bool)? {
        try Row.fetchOne(db, cached: "SELECT doc, pending FROM kv WHERE key = ?", arguments: [key]).map { ($0["doc"], $0["pending"]) }
    }

    public func kvPut(_ key: String, doc: Data, pending: Bool) throws {
        try db.execute(cached: "INSERT OR REPLACE INTO kv (key, doc, pending) VALUES (?, ?, ?)", arguments: [key, doc, pending])
    }

    // MARK: partial downloads

    /// Chunks of `ino` known to be in its cache file (synced), for `version` in `chunkSize` chunks.
    public func saveDownload(_ ino: UInt64, version: String, chunkSize: Int64, present: [Bool]) throws {
        try db.execute(cached: "INSERT OR REPLACE INTO downloads (ino, version, chunk_size, chunks) VALUES (?, ?, ?, ?)",
                       arguments: [Int64(bitPattern: ino), version, chunkSize, Data(present.map { $0 ? 1 : 0 })])
    }

    public func download(_ ino: UInt64) throws -> (version: String, chunkSize: Int64, present: [Bool])? {
        try Row.fetchOne(db, cached: "SELECT version, chunk_size, chunks FROM downloads WHERE ino = ?",
                         arguments: [Int64(bitPattern: ino)]).map {
            ($0["version"], $0["chunk_size"], [UInt8]($0["chunks"] as Data).map { $0 != 0 })
        }
    }

    /// Forgets the saved progress of `ino`'s download (of `version` only, when given: a download
    /// of a newer version may have started meanwhile).
    public func removeDownload(_ ino: UInt64, version: String? = nil) throws {
        if let version {
            try db.execute(cached: "DELETE FROM downloads WHERE ino = ? AND version = ?", arguments: [Int64(bitPattern: ino), version])
        } else {
            try db.execute(cached: "DELETE FROM downloads WHERE ino = ?", arguments: [Int64(bitPattern: ino)])
        }
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

    public func allXattrs() throws -> [UInt64: [[UInt8]: [UInt8]]] {
        var out: [UInt64: [[UInt8]: [UInt8]]] = [:]
        for r in try Row.fetchAll(db, cached: "SELECT ino, name, value FROM xattrs") {
            out[UInt64(bitPattern: r["ino"]), default: [:]][[UInt8](r["name"] as Data)] = [UInt8](r["value"] as Data)
        }
        return out
    }

    // MARK: outbox

    /// Queues `ino` for upload (coalesced: one row per inode), not before `delay` seconds.
    public func enqueue(_ ino: UInt64, delay: TimeInterval = 0) throws {
        try db.cachedStatement(sql: """
            INSERT INTO outbox (ino, seq, not_before) VALUES (?, (SELECT coalesce(max(seq), 0) + 1 FROM outbox), ?)
            ON CONFLICT (ino) DO UPDATE SET seq = excluded.seq, not_before = max(outbox.not_before, excluded.not_before)
            """).execute(arguments: [Int64(bitPattern: ino), Date().timeIntervalSince1970 + delay])
    }

    public struct OutboxItem: Sendable { public var ino: UInt64; public var seq: Int64; public var attempts: Int }

    /// Items due now, oldest first.
    public func dueOutbox(limit: Int, asOf now: Date = Date()) throws -> [OutboxItem] {
        try Row.fetchAll(db, cached: "SELECT ino, seq, attempts FROM outbox WHERE not_before <= ? ORDER BY seq LIMIT ?",
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
            """, arguments: [attempt ? 1 : 0, Date().timeIntervalSince1970 + delay, Int64(bitPattern: ino)])
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
