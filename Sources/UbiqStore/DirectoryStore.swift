import Foundation
import UbiqClock
import GRDB
import Synchronization
import CUbiq

/// The embedded default store: a directory that behaves like a cloud service.
///
/// Layout under `root`:
/// - `store.db`: SQLite (WAL) index of current objects, prior versions and
///   the change journal; shared safely by several processes (devices). Journal entries, and
///   the versions of deleted keys, older than `journalRetention` are dropped (`pruneJournal`,
///   `pruneDeleted`); a device whose cursor stood in what was dropped compares everything
///   (`changes(since:)` answers `reset`).
/// - `blobs/<xx>/<version>`: one immutable file per version.
/// - `tmp/`: uploads in progress (renamed into `blobs/` once complete).
///
/// Writes are transactions: a conditional put checks the precondition and
/// installs the new version atomically, so two devices racing on one key
/// see one winner and one `preconditionFailed`.
public final class DirectoryStore: CloudStore, @unchecked Sendable {
    public let root: URL
    /// Prior versions kept per key (the current one is extra).
    public let keptVersions: Int
    /// How long the change journal keeps an entry (a device away for longer compares the
    /// store's whole listing with what it recorded at its next look, as after a restore), and
    /// how long a deleted key's versions are kept, as a cloud service's bin keeps them.
    public let journalRetention: TimeInterval
    /// 30 days: a laptop left in a drawer over a holiday still goes on from its cursor.
    public static let defaultJournalRetention: TimeInterval = 30 * 86_400
    /// How often a process that writes to the store prunes the journal and the deleted keys'
    /// versions (and once at open).
    static let journalPruneInterval: TimeInterval = 3600
    private let db: DatabasePool
    /// The time its journal and versions are stamped and pruned by.
    let time: any TimeSource
    let lastPrune: Mutex<Date>

    public init(root: URL, keptVersions: Int = 10, journalRetention: TimeInterval = DirectoryStore.defaultJournalRetention,
                time: any TimeSource = SystemTime()) throws {
        self.root = root
        self.time = time
        lastPrune = Mutex(time.now)
        self.keptVersions = keptVersions
        self.journalRetention = journalRetention
        let fm = FileManager.default
        do {
            try fm.createDirectory(at: root.appendingPathComponent("blobs"), withIntermediateDirectories: true)
            try fm.createDirectory(at: root.appendingPathComponent("tmp"), withIntermediateDirectories: true)
        } catch {
            throw StoreError.failed("cannot create store at \(root.path): \(error.localizedDescription)")
        }
        Self.removeAbandonedUploads(in: root.appendingPathComponent("tmp"), now: time.now)
        // The store is its owner's alone: the index holds every name, owner and xattr value.
        // (SQLite gives its -wal and -shm files the mode of the database file.)
        let index = root.appendingPathComponent("store.db").path
        if getuid() == Self.owner(root.path) {
            chmod(root.path, 0o700)
            for f in [index, index + "-wal", index + "-shm"] { chmod(f, 0o600) }
        }
        if !fm.fileExists(atPath: index) { fm.createFile(atPath: index, contents: nil, attributes: [.posixPermissions: 0o600]) }
        var config = Configuration()
        config.busyMode = .timeout(30)
        do {
            db = try DatabasePool(path: index, configuration: config)
            try Self.migrator.migrate(db)
            identity = try db.write { db in
                if let id = try String.fetchOne(db, sql: "SELECT value FROM settings WHERE name = 'store_id'") { return id }
                let id = UUID().uuidString.lowercased()
                try db.execute(sql: "INSERT INTO settings (name, value) VALUES ('store_id', ?)", arguments: [id])
                return id
            }
        } catch {
            throw StoreError.failed("cannot open store index at \(root.path): \(error)")
        }
        // A store on a read-only disk still opens (to be read); the next write prunes.
        try? pruneJournal()
        try? pruneDeleted()
    }

    /// What makes a folder a store (a failed first mount in an empty folder takes it away).
    public static let layout = ["store.db", "store.db-wal", "store.db-shm", "blobs", "tmp"]

    /// Whether the folder at `path` holds a store.
    public static func isStore(at path: String) -> Bool { FileManager.default.fileExists(atPath: path + "/store.db") }

    /// This store's own name, made with it: a store made anew at the same path has another.
    /// A device remembers the one it synced with, and will not take another for it.
    public let identity: String

    private static func owner(_ path: String) -> uid_t? {
        var st = stat()
        return stat(path, &st) == 0 ? st.st_uid : nil
    }

    /// An upload is written to `tmp/` as it goes; a device killed mid-upload leaves its part
    /// there. One untouched for a day is dead (a live upload writes to it all the time); it
    /// is removed when the store is next opened. Uploads start over, so nothing is lost.
    static let abandonedUploadAge: TimeInterval = 24 * 3600

    static func removeAbandonedUploads(in tmp: URL, now: Date) {
        let fm = FileManager.default
        guard let names = try? fm.contentsOfDirectory(atPath: tmp.path) else { return }
        for name in names {
            let path = tmp.appendingPathComponent(name).path
            guard let modified = (try? fm.attributesOfItem(atPath: path))?[.modificationDate] as? Date,
                  now.timeIntervalSince(modified) > abandonedUploadAge else { continue }
            unlink(path)
        }
    }

    private static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE objects (
                  key TEXT PRIMARY KEY, version TEXT NOT NULL, size INTEGER NOT NULL,
                  meta BLOB NOT NULL, blob TEXT NOT NULL, modified REAL NOT NULL);
                CREATE TABLE versions (
                  key TEXT NOT NULL, version TEXT NOT NULL, size INTEGER NOT NULL,
                  meta BLOB NOT NULL, blob TEXT NOT NULL, modified REAL NOT NULL,
                  PRIMARY KEY (key, version));
                CREATE TABLE journal (
                  seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL,
                  key TEXT NOT NULL, version TEXT);
                """)
        }
        m.registerMigration("v2: settings") { db in
            try db.execute(sql: "CREATE TABLE settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        }
        m.registerMigration("v3: journal times") { db in
            // Entries from before it have none: they are older than any that has one.
            try db.execute(sql: "ALTER TABLE journal ADD COLUMN at REAL")
        }
        m.registerMigration("v4: deleted keys") { db in
            // Whether a blob is still used is asked of both tables at every version dropped;
            // keys deleted, and when, for `pruneDeleted` (those deleted before it: when their
            // newest version was archived).
            try db.execute(sql: """
                CREATE INDEX objects_blob ON objects (blob);
                CREATE INDEX versions_blob ON versions (blob);
                CREATE TABLE deleted (key TEXT PRIMARY KEY, at REAL NOT NULL);
                CREATE INDEX deleted_at ON deleted (at);
                INSERT OR IGNORE INTO deleted (key, at)
                  SELECT key, max(modified) FROM versions v WHERE NOT EXISTS (SELECT 1 FROM objects o WHERE o.key = v.key)
                  GROUP BY key HAVING max(modified) IS NOT NULL;
                """)
        }
        return m
    }

    // MARK: - CloudStore

    public func head(_ key: String) async throws -> ObjectInfo {
        try StoreKey.validate(key)
        guard let info = try dbRead({ db in try Self.current(db, key) }) else {
            throw StoreError.notFound(key: key)
        }
        return info.info
    }

    /// Keys are read as bytes: one that is not exactly representable as a
    /// key (invalid UTF-8, a NUL, a malformed path) is left out of the listing,
    /// never turned into a similar-looking name.
    public func list(prefix: String) async throws -> [ObjectInfo] {
        // Row by row into an array made once (not every row first, then the objects: a whole
        // store's listing twice over, at a mount's import).
        try dbRead { db in
            let (range, arguments) = Self.keyRange(prefix: prefix)
            let count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM objects WHERE \(range)", arguments: arguments) ?? 0
            var out: [ObjectInfo] = []
            out.reserveCapacity(count)
            try Self.listRows(db, prefix: prefix) { out.append($0) }
            return out
        }
    }

    /// A page at a time, each its own read (from the key after the last one's: the key's
    /// index, not an offset): first the page's keys alone, then the rows of those `wanted`.
    public func list(prefix: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
                     _ body: ([ObjectInfo]) throws -> Void) async throws {
        var after: Data?
        while true {
            var keys: [(raw: Data, key: String)] = []
            let (last, more) = try dbRead { db in try Self.listKeys(db, prefix: prefix, after: after, limit: max(1, size)) { keys.append($0) } }
            guard let last else { return }
            let mask = try keys.isEmpty ? [] : wanted(keys.map(\.key))  // a page of keys that are not
            let chosen = Set(zip(keys, mask).lazy.filter(\.1).map(\.0.raw))
            if !chosen.isEmpty {
                // Read again up to the page's last key: what changed meanwhile is as listed
                // now, what was added meanwhile is not of this page.
                var page: [ObjectInfo] = []
                try dbRead { db in try Self.listRows(db, prefix: prefix, after: after, through: last, only: chosen) { page.append($0) } }
                if !page.isEmpty { try body(page) }
            }
            guard more else { return }
            after = last
        }
    }

    /// The keys under `prefix` after `after` (bytes), at most `limit`, to `each` (as bytes and
    /// as text; those that are not keys are passed over, as by `listRows`); the last key read,
    /// and whether `limit` were read (more may follow).
    private static func listKeys(_ db: Database, prefix: String, after: Data?, limit: Int,
                                 _ each: ((raw: Data, key: String)) -> Void) throws -> (Data?, Bool) {
        let (range, arguments) = keyRange(prefix: prefix, after: after)
        let raws = try Data.fetchCursor(db, sql: "SELECT CAST(key AS BLOB) FROM objects WHERE \(range) ORDER BY key LIMIT ?",
                                        arguments: arguments + [limit])
        var read = 0
        var last: Data?
        while let raw = try raws.next() {
            read += 1
            last = raw
            if let key = key(raw) { each((raw, key)) }
        }
        return (last, read == limit)
    }

    /// Objects under `prefix` after the key `after` and up to `through` (bytes; nil: no bound),
    /// only those whose key is in `only` (nil: all), to `each`.
    private static func listRows(_ db: Database, prefix: String, after: Data? = nil, through: Data? = nil,
                                 only: Set<Data>? = nil, _ each: (ObjectInfo) -> Void) throws {
        let (range, arguments) = keyRange(prefix: prefix, after: after, through: through)
        let rows = try Row.fetchCursor(db, sql: """
            SELECT CAST(key AS BLOB) AS rawkey, version, size, meta, blob FROM objects WHERE \(range) ORDER BY key
            """, arguments: arguments)
        while let row = try rows.next() {
            guard let raw = Data.fromDatabaseValue(row["rawkey"]), only?.contains(raw) ?? true, let key = key(raw) else { continue }
            each(Self.info(row, key: key))
        }
    }

    /// The condition on `key` for keys under `prefix`, after `after` and up to `through`
    /// (bytes), with its arguments: ranges of the key's index, compared as bytes (as the
    /// index orders them). An `? IS NULL OR` test or a `substr` had the index scanned from its
    /// start for every page: a million keys' import spent most of its time there. Only text
    /// is a key: a value of another type planted in the index (a blob sorts after every text,
    /// a number before) is never listed, and never a page's bound.
    private static func keyRange(prefix: String, after: Data? = nil, through: Data? = nil) -> (String, StatementArguments) {
        // One bound each way (with two, SQLite may seek by the looser one and test the other on
        // every row): `after` and `through` are keys under the prefix, so within its range.
        var conditions: [String] = []
        var arguments: StatementArguments = []
        if let after {
            conditions.append("key > CAST(? AS TEXT)"); arguments += [after]
        } else {
            conditions.append("key >= CAST(? AS TEXT)"); arguments += [Data(prefix.utf8)]
        }
        if let through {
            conditions.append("key <= CAST(? AS TEXT)"); arguments += [through]
        } else if prefix.isEmpty {
            conditions.append("key < X''")
        } else {
            // Every key that starts with the prefix's bytes sorts before the prefix with its
            // last byte one higher (UTF-8 never holds 0xFF, so there is one).
            var end = Array(prefix.utf8)
            end[end.count - 1] += 1
            conditions.append("key < CAST(? AS TEXT)"); arguments += [Data(end)]
        }
        return (conditions.joined(separator: " AND "), arguments)
    }

    /// A listed key's bytes as a key. One that is not exactly representable as a key (invalid
    /// UTF-8, a NUL, a malformed path) is left out, never turned into a similar-looking name.
    private static func key(_ raw: Data) -> String? {
        guard !raw.contains(0), let key = String(validating: raw, as: UTF8.self), (try? StoreKey.validate(key)) != nil else { return nil }
        return key
    }

    /// Copies inside the kernel (copy_file_range): the bytes never pass through the process.
    public func read(_ key: String, version: String, range: Range<Int64>, into fd: Int32, at offset: Int64) async throws -> Int64 {
        let (blob, lower, upper) = try locate(key, version: version, range: range)
        if upper == lower { return 0 }
        let src = open(blobURL(blob).path, O_RDONLY | O_CLOEXEC)
        if src < 0 { throw StoreError.failed("blob of \(key)@\(version) missing: errno \(errno)") }
        defer { close(src) }
        var done: Int64 = 0
        while done < upper - lower {
            let n = cubiq_copy_file_range_at(src, lower + done, fd, offset + done, Int(upper - lower - done))
            if n < 0 {
                let e = errno
                if e == EINTR { continue }
                if e == EXDEV || e == ENOSYS || e == EOPNOTSUPP || e == EINVAL {
                    // Not between these filesystems: copy through memory.
                    let data = try await read(key, version: version, range: (lower + done) ..< upper)
                    try LocalWriteError.write(data, to: fd, at: offset + done)
                    return done + Int64(data.count)
                }
                if e == ENOSPC || e == EDQUOT || e == EIO || e == EFBIG { throw LocalWriteError(errno: e) }
                throw StoreError.failed("reading blob of \(key): errno \(e)")
            }
            if n == 0 { throw StoreError.failed("blob of \(key)@\(version) is short") }
            done += Int64(n)
        }
        return done
    }

    /// The blob holding `version` of `key`, and `range` clamped to its size.
    private func locate(_ key: String, version: String, range: Range<Int64>) throws -> (blob: String, lower: Int64, upper: Int64) {
        try StoreKey.validate(key)
        let found: (blob: String, size: Int64)? = try dbRead { db in
            let row = try Row.fetchOne(db, sql: "SELECT blob, size FROM objects WHERE key = ? AND version = ?",
                                       arguments: [key, version])
                ?? Row.fetchOne(db, sql: "SELECT blob, size FROM versions WHERE key = ? AND version = ?",
                                arguments: [key, version])
            guard let row else { return nil }
            guard let blob = String.fromDatabaseValue(row["blob"]), let size = Self.integer(row["size"]), size >= 0 else {
                throw StoreError.failed("\(key)@\(version): its record in the store index is unreadable")
            }
            return (blob, size)
        }
        guard let found else { throw StoreError.notFound(key: key) }
        let lower = max(0, min(range.lowerBound, found.size))
        let upper = max(lower, min(range.upperBound, found.size))
        return (found.blob, lower, upper)
    }

    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        let (blob, lower, upper) = try locate(key, version: version, range: range)
        if upper == lower { return Data() }
        let fd = open(blobURL(blob).path, O_RDONLY | O_CLOEXEC)
        if fd < 0 { throw StoreError.failed("blob of \(key)@\(version) missing: errno \(errno)") }
        defer { close(fd) }
        var data = Data(count: Int(upper - lower))
        var done = 0
        let want = data.count
        let err: Int32 = data.withUnsafeMutableBytes { buf in
            while done < want {
                let n = pread(fd, buf.baseAddress! + done, want - done, off_t(lower) + off_t(done))
                if n < 0 { if errno == EINTR { continue }; return errno }
                if n == 0 { return EIO }
                done += n
            }
            return 0
        }
        if err != 0 { throw StoreError.failed("reading blob of \(key): errno \(err)") }
        return data
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition) async throws -> ObjectInfo {
        try await put(key, contentsOf: source, metadata: metadata, condition: condition, progress: nil)
    }

    /// Reports the bytes copied into the store, every 8 MiB.
    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition, progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        try StoreKey.validate(key)
        // Refuse early what cannot fit, before copying it (the transaction checks again).
        // Only a store with a quota sums what it holds: that costs a scan of every object.
        if let source, try dbRead({ db in try Self.quota(db) }) != nil, let u = try await usage(), let quota = u.quotaBytes,
           let attrs = try? FileManager.default.attributesOfItem(atPath: source.path),
           let size = attrs[.size] as? Int64, size > quota - u.usedBytes,
           size > quota - u.usedBytes + ((try? await head(key))?.size ?? 0) {
            throw StoreError.quotaExceeded(key: key)
        }
        let version = Self.newVersion(now: time.now)
        let size = try stageBlob(version: version, from: source, progress: progress)
        return try install(key: key, version: version, size: size, metadata: metadata,
                           blob: version, condition: condition)
    }

    public func copy(from source: String, version: String, to destination: String,
                     metadata: ObjectMetadata?, condition: WriteCondition) async throws -> ObjectInfo {
        try StoreKey.validate(source)
        try StoreKey.validate(destination)
        let src: (blob: String, size: Int64, meta: ObjectMetadata)? = try dbRead { db in
            let row = try Row.fetchOne(db, sql: "SELECT version, blob, size, meta FROM objects WHERE key = ? AND version = ?",
                                       arguments: [source, version])
                ?? Row.fetchOne(db, sql: "SELECT version, blob, size, meta FROM versions WHERE key = ? AND version = ?",
                                arguments: [source, version])
            guard let row else { return nil }
            let info = Self.info(row, key: source)
            if let why = info.defect { throw StoreError.failed("\(source)@\(version): \(why)") }
            return (info.contentTag ?? "", info.size, info.metadata)
        }
        guard let src else { throw StoreError.notFound(key: source) }
        // Blobs are immutable and shared between versions by hard link-free reference:
        // a copy records the same blob under a new version id.
        return try install(key: destination, version: Self.newVersion(now: time.now), size: src.size,
                           metadata: (metadata ?? src.meta).describing(digest: src.meta.sha256), blob: src.blob,
                           copyOf: source, condition: condition)
    }

    public func delete(_ key: String, condition: WriteCondition) async throws {
        try StoreKey.validate(key)
        var orphans: [String] = []
        let now = time.now
        try dbWrite { db in
            let cur = try Self.current(db, key)
            try Self.check(condition, key: key, current: cur?.info.version)
            guard cur != nil else { return }
            try Self.archive(db, key: key, now: now)
            try db.execute(sql: "DELETE FROM objects WHERE key = ?", arguments: [key])
            try db.execute(sql: "INSERT OR REPLACE INTO deleted (key, at) VALUES (?, ?)", arguments: [key, now.timeIntervalSince1970])
            try Self.journal(db, op: "delete", key: key, version: nil, now: now)
            orphans = try self.prune(db, key: key)
        }
        removeBlobs(orphans)
        pruneJournalWhenDue()
    }

    private static func journal(_ db: Database, op: String, key: String, version: String?, now: Date) throws {
        try db.execute(sql: "INSERT INTO journal (op, key, version, at) VALUES (?, ?, ?, ?)",
                       arguments: [op, key, version, now.timeIntervalSince1970])
    }

    /// Drops the journal's entries from before the newest one older than `journalRetention`
    /// (that one is kept: a cursor standing on it still goes on). Entries are numbered in the
    /// order they were written, so every one before an old entry is as old (give or take the
    /// clocks of the devices that share the store: an entry dropped a little early costs a
    /// device a comparison, never a change). The newest entry is never dropped, so the
    /// journal's end, and every cursor at it, stays. Returns how many were dropped.
    @discardableResult
    public func pruneJournal(now: Date? = nil) throws -> Int {
        let now = now ?? time.now
        lastPrune.withLock { $0 = now }
        var dropped = 0
        try dbWrite { db in
            let cutoff = now.timeIntervalSince1970 - journalRetention
            guard let boundary = try Int64.fetchOne(db, sql: "SELECT seq FROM journal WHERE at < ? ORDER BY seq DESC LIMIT 1",
                                                    arguments: [cutoff]) else { return }
            try db.execute(sql: "DELETE FROM journal WHERE seq < ?", arguments: [boundary])
            dropped = db.changesCount
        }
        return dropped
    }

    /// Drops every version of each key deleted more than `journalRetention` ago (table
    /// `deleted`: a delete notes the key and the time, a put takes it out), and the blobs no
    /// other version or object uses. A cloud service's bin does the same: without it a deleted
    /// file's bytes stayed in the store for good, and deleting freed no space. The keys come
    /// by the time they were deleted (an index), so a store with nothing due costs one lookup;
    /// a batch at a time, each its own transaction (other devices' writes wait for one batch,
    /// not for all). Returns how many versions were dropped.
    @discardableResult
    public func pruneDeleted(now: Date? = nil, batch: Int = 1000) throws -> Int {
        let now = now ?? time.now
        let cutoff = now.timeIntervalSince1970 - journalRetention
        var dropped = 0
        while true {
            var orphans: [String] = []
            var taken = 0
            try dbWrite { db in
                // Each row taken leaves the table, so every batch is new. A key is bound back
                // as it is stored (whatever its type: anyone may plant a row).
                let due = try Row.fetchAll(db, sql: "SELECT rowid, key FROM deleted WHERE at < ? ORDER BY at LIMIT ?",
                                           arguments: [cutoff, batch])
                taken = due.count
                for row in due {
                    let key: DatabaseValue = row["key"]
                    try db.execute(sql: "DELETE FROM deleted WHERE rowid = ?", arguments: [row["rowid"] as DatabaseValue])
                    // Made again (by a writer that did not take it out): its versions are its history.
                    if try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM objects WHERE key = ?)", arguments: [key]) ?? true {
                        continue
                    }
                    let blobs = try String.fetchAll(db, sql: "SELECT DISTINCT blob FROM versions WHERE key = ?", arguments: [key])
                    try db.execute(sql: "DELETE FROM versions WHERE key = ?", arguments: [key])
                    dropped += db.changesCount
                    for blob in blobs where try !Self.used(db, blob: blob) { orphans.append(blob) }
                }
            }
            removeBlobs(orphans)
            if taken < batch { return dropped }
        }
    }

    private func pruneJournalWhenDue() {
        let due = lastPrune.withLock { time.now.timeIntervalSince($0) >= Self.journalPruneInterval }
        if due {
            try? pruneJournal()
            try? pruneDeleted()
        }
    }

    /// Whether an object or a version still has `blob` as its bytes.
    private static func used(_ db: Database, blob: String) throws -> Bool {
        try Bool.fetchOne(db, sql: """
            SELECT EXISTS (SELECT 1 FROM objects WHERE blob = ?) OR EXISTS (SELECT 1 FROM versions WHERE blob = ?)
            """, arguments: [blob, blob]) ?? true
    }

    /// A cursor is `SEQ:MARK`: the journal entry it stands after, and a mark of that entry
    /// (its operation, key and version). A store restored from a backup goes on numbering from
    /// its older end, so a number alone can name another entry; the mark tells, and so does a
    /// number past the journal's end. Either way the device must compare everything (`reset`),
    /// as it must when its cursor stands before what the journal still holds (`pruneJournal`).
    /// (A bare `SEQ`, from before marks, is taken as it is.)
    public func changes(since cursor: String?, limit: Int) async throws -> ChangeBatch {
        let parts = (cursor ?? "0").split(separator: ":", maxSplits: 1).map(String.init)
        let after = Int64(parts.first ?? "0") ?? -1
        return try dbRead { db in
            let end = try Int64.fetchOne(db, sql: "SELECT coalesce(max(seq), 0) FROM journal") ?? 0
            let markMatches = try parts.count < 2 || after == 0 || Self.mark(db, after) == parts[1]
            let first = try Int64.fetchOne(db, sql: "SELECT min(seq) FROM journal")
            if after < 0 || after > end || !markMatches || after < (first ?? 1) - 1 {
                return ChangeBatch(changes: [], cursor: try Self.cursor(db, end), reset: true)
            }
            let rows = try Row.fetchAll(db, sql: "SELECT seq, op, key, version FROM journal WHERE seq > ? ORDER BY seq LIMIT ?",
                                        arguments: [after, limit])
            // Every column as it is stored: another device's (or anyone's) write may have put
            // anything there. A row this cannot read is passed over, and said.
            var changes: [StoreChange] = []
            var unreadable: [String] = []
            var last = after
            for r in rows {
                guard let seq = Self.integer(r["seq"]) else { continue }
                last = max(last, seq)
                let key = String.fromDatabaseValue(r["key"]), op = String.fromDatabaseValue(r["op"])
                guard let key, !key.utf8.contains(0), let op, op == "put" || op == "delete" else {
                    let raw = Data.fromDatabaseValue(r["key"]).map { String(decoding: $0, as: UTF8.self).debugDescription } ?? "none"
                    unreadable.append("journal entry \(seq) (key \(raw), operation \(op?.debugDescription ?? "unreadable"))")
                    continue
                }
                changes.append(StoreChange(kind: op == "put" ? .put : .delete, key: key, version: String.fromDatabaseValue(r["version"])))
            }
            return ChangeBatch(changes: changes, cursor: try Self.cursor(db, last), reset: false, more: rows.count >= limit,
                               unreadable: unreadable)
        }
    }

    public func currentCursor() async throws -> String {
        try dbRead { db in try Self.cursor(db, try Int64.fetchOne(db, sql: "SELECT coalesce(max(seq), 0) FROM journal") ?? 0) }
    }

    private static func cursor(_ db: Database, _ seq: Int64) throws -> String {
        guard seq > 0, let mark = try mark(db, seq) else { return String(seq) }
        return "\(seq):\(mark)"
    }

    /// A stable mark of journal entry `seq` (FNV-1a of its operation, key and version).
    private static func mark(_ db: Database, _ seq: Int64) throws -> String? {
        guard let r = try Row.fetchOne(db, sql: "SELECT op, key, version FROM journal WHERE seq = ?", arguments: [seq]) else { return nil }
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for part in [Data.fromDatabaseValue(r["op"]), Data.fromDatabaseValue(r["key"]), Data.fromDatabaseValue(r["version"])] {
            for b in (part ?? Data()) + [0] { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        }
        return String(h, radix: 16)
    }

    /// Bytes of current objects, and the quota if one is set (`setQuota`).
    public func usage() async throws -> StoreUsage? {
        try dbRead { db in
            StoreUsage(usedBytes: try Self.used(db), quotaBytes: try Self.quota(db))
        }
    }

    /// Sets (or with nil removes) the store's quota: a put that would take current objects
    /// over it is refused with `quotaExceeded`, as a cloud service refuses.
    public func setQuota(_ bytes: Int64?) throws {
        try dbWrite { db in
            if let bytes {
                try db.execute(sql: "INSERT OR REPLACE INTO settings (name, value) VALUES ('quota', ?)", arguments: [String(bytes)])
            } else {
                try db.execute(sql: "DELETE FROM settings WHERE name = 'quota'")
            }
        }
    }

    private static func quota(_ db: Database) throws -> Int64? {
        try String.fetchOne(db, sql: "SELECT value FROM settings WHERE name = 'quota'").flatMap { Int64($0) }
    }

    private static func used(_ db: Database) throws -> Int64 {
        try Int64.fetchOne(db, sql: "SELECT coalesce(sum(size), 0) FROM objects") ?? 0
    }

    public func versions(of key: String) async throws -> [ObjectInfo] {
        try StoreKey.validate(key)
        return try dbRead { db in
            var out: [ObjectInfo] = []
            if let cur = try Self.current(db, key) { out.append(cur.info) }
            let rows = try Row.fetchAll(db, sql: "SELECT key, version, size, meta, blob FROM versions WHERE key = ? ORDER BY modified DESC",
                                        arguments: [key])
            out += rows.map { Self.info($0, key: key) }.filter { $0.defect == nil }
            return out
        }
    }

    // MARK: - Internals

    /// `copyOf`: the key whose version's blob this is (a copy), not a blob of its own.
    private func install(key: String, version: String, size: Int64, metadata: ObjectMetadata,
                         blob: String, copyOf: String? = nil, condition: WriteCondition) throws -> ObjectInfo {
        var orphans: [String] = []
        let now = time.now
        do {
            try dbWrite { db in
                let cur = try Self.current(db, key)
                try Self.check(condition, key: key, current: cur?.info.version)
                if let quota = try Self.quota(db),
                   try Self.used(db) - (cur?.info.size ?? 0) + size > quota {
                    throw StoreError.quotaExceeded(key: key)
                }
                // A copy's blob is its source version's: one dropped since the copy read it
                // (`prune`, `pruneDeleted`) is gone, and so is that version.
                if let copyOf, try !Self.used(db, blob: blob) { throw StoreError.notFound(key: copyOf) }
                if cur != nil { try Self.archive(db, key: key, now: now) }
                try db.execute(sql: "DELETE FROM deleted WHERE key = ?", arguments: [key])
                try db.execute(sql: """
                    INSERT OR REPLACE INTO objects (key, version, size, meta, blob, modified)
                    VALUES (?, ?, ?, ?, ?, ?)
                    """, arguments: [key, version, size, try Self.encodeMeta(metadata), blob,
                                     now.timeIntervalSince1970])
                try Self.journal(db, op: "put", key: key, version: version, now: now)
                orphans = try self.prune(db, key: key)
            }
        } catch {
            if blob == version { removeBlobs([blob]) }
            throw error
        }
        removeBlobs(orphans)
        pruneJournalWhenDue()
        return ObjectInfo(key: key, version: version, size: size, metadata: metadata, contentTag: blob)
    }

    /// Moves the current version of `key` into `versions`.
    private static func archive(_ db: Database, key: String, now: Date) throws {
        try db.execute(sql: """
            INSERT OR REPLACE INTO versions (key, version, size, meta, blob, modified)
            SELECT key, version, size, meta, blob, ? FROM objects WHERE key = ?
            """, arguments: [now.timeIntervalSince1970, key])
    }

    /// Drops versions beyond `keptVersions`; returns blobs no longer referenced.
    private func prune(_ db: Database, key: String) throws -> [String] {
        let old = try Row.fetchAll(db, sql: """
            SELECT version, blob FROM versions WHERE key = ? ORDER BY modified DESC LIMIT -1 OFFSET ?
            """, arguments: [key, keptVersions])
        var orphans: [String] = []
        for r in old {
            guard let blob = String.fromDatabaseValue(r["blob"]), let version = String.fromDatabaseValue(r["version"]) else { continue }
            try db.execute(sql: "DELETE FROM versions WHERE key = ? AND version = ?", arguments: [key, version])
            if try !Self.used(db, blob: blob) { orphans.append(blob) }
        }
        return orphans
    }

    private static func check(_ condition: WriteCondition, key: String, current: String?) throws {
        switch condition {
        case .always: return
        case .ifAbsent:
            if current != nil { throw StoreError.preconditionFailed(key: key, current: current) }
        case .ifMatch(let v):
            if current != v { throw StoreError.preconditionFailed(key: key, current: current) }
        }
    }

    private struct Current { var info: ObjectInfo; var blob: String }

    private static func current(_ db: Database, _ key: String) throws -> Current? {
        guard let row = try Row.fetchOne(db, sql: "SELECT key, version, size, meta, blob FROM objects WHERE key = ?",
                                         arguments: [key]) else { return nil }
        let info = info(row, key: key)
        return Current(info: info, blob: info.contentTag ?? "")
    }

    /// An object's record as far as it can be read: metadata that does not decode is that of
    /// an object another tool wrote (`ObjectMetadata.issues` says so); a version, size or blob
    /// of the wrong type makes it `defect`ive (left out by devices, with a warning).
    private static func info(_ row: Row, key: String) -> ObjectInfo {
        let version = String.fromDatabaseValue(row["version"]), size = Self.integer(row["size"]), blob = String.fromDatabaseValue(row["blob"])
        let meta: ObjectMetadata
        if let raw = Data.fromDatabaseValue(row["meta"]) {
            do { meta = try ObjectMetadata.read(json: raw) } catch {
                meta = .unreadable(key: key, why: "not ubiq's metadata JSON")
            }
        } else {
            meta = .unreadable(key: key, why: "none")
        }
        var info = ObjectInfo(key: key, version: version ?? "", size: size ?? 0, metadata: meta, contentTag: blob)
        if version == nil || size == nil || blob == nil { info.defect = "its record in the store index is unreadable" }
        return info
    }

    // Columns are read as what they hold, never trapping on another type (GRDB's typed
    // subscripts do): `String.fromDatabaseValue` (nil for bytes that are not UTF-8),
    // `Data.fromDatabaseValue`, and integers here (GRDB's would cut 1.5 to 1).
    static func integer(_ v: DatabaseValue) -> Int64? {
        if case .int64(let i) = v.storage { return i }
        return nil
    }

    private static func encodeMeta(_ m: ObjectMetadata) throws -> Data { try JSONEncoder().encode(m) }

    private static func newVersion(now: Date) -> String {
        // Time-ordered prefix keeps versions sortable; the random part makes them unique across devices.
        let t = UInt64(now.timeIntervalSince1970 * 1_000_000)
        let r = UInt32.random(in: 0 ... .max)
        return String(format: "%014llx%08x", t, r)
    }

    private func blobURL(_ blob: String) -> URL {
        root.appendingPathComponent("blobs").appendingPathComponent(String(blob.suffix(2)))
            .appendingPathComponent(blob)
    }

    /// Copies `source` into a new immutable blob; returns its size.
    private func stageBlob(version: String, from source: URL?, progress: (@Sendable (Int64) -> Void)?) throws -> Int64 {
        let tmp = root.appendingPathComponent("tmp").appendingPathComponent(version)
        let dst = blobURL(version)
        let out = open(tmp.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        if out < 0 { throw Self.ioError("creating \(tmp.path)", errno) }
        var size: Int64 = 0
        do {
            defer { close(out) }
            if let source {
                let inp = open(source.path, O_RDONLY | O_CLOEXEC)
                if inp < 0 { throw Self.ioError("opening \(source.path)", errno) }
                defer { close(inp) }
                do { size = try FileCopy.copy(from: inp, to: out, progress: progress) } catch let e as LocalWriteError {
                    throw Self.ioError("writing \(tmp.path)", e.errno)
                }
            }
            if fsync(out) != 0 { throw Self.ioError("fsync \(tmp.path)", errno) }
        } catch {
            unlink(tmp.path)
            throw error
        }
        try? FileManager.default.createDirectory(at: dst.deletingLastPathComponent(), withIntermediateDirectories: true)
        if rename(tmp.path, dst.path) != 0 {
            let e = errno
            unlink(tmp.path)
            throw Self.ioError("installing blob", e)
        }
        return size
    }

    /// The store's disk failing (read-only, its folder gone, no permission, an I/O error) can
    /// heal: the write is tried again, with backoff, for as long as it takes.
    private static func ioError(_ what: String, _ e: Int32) -> StoreError {
        if e == ENOSPC || e == EDQUOT { return .quotaExceeded(key: what) }
        return .unavailable("\(what): \(String(cString: strerror(e)))")
    }

    /// Only names a blob can have: a record planted in the index (anyone with the folder can
    /// write one) never names a file elsewhere.
    private func removeBlobs(_ blobs: [String]) {
        for b in blobs where !b.isEmpty && !b.contains("/") && b != "." && b != ".." { unlink(blobURL(b).path) }
    }

    private func dbRead<T>(_ body: (Database) throws -> T) throws -> T {
        do { return try db.read(body) } catch let e as StoreError { throw e } catch {
            throw StoreError.unavailable("store index: \(error)")
        }
    }

    private func dbWrite(_ body: (Database) throws -> Void) throws {
        do { try db.write(body) } catch let e as StoreError { throw e } catch {
            throw StoreError.unavailable("store index: \(error)")
        }
    }
}

/// Kernel-side file copy (copy_file_range), falling back to read/write.
public enum FileCopy {
    /// Copies everything from the current offset of `inp` to `out`; returns bytes copied.
    /// `progress` is told the running total (then the copy goes in 8 MiB steps).
    public static func copy(from inp: Int32, to out: Int32, progress: (@Sendable (Int64) -> Void)? = nil) throws -> Int64 {
        var total: Int64 = 0
        while true {
            let n = cubiq_copy_file_range(inp, out, progress == nil ? 1 << 30 : 8 << 20)
            if n > 0 { total += Int64(n); progress?(total); continue }
            if n == 0 { return total }
            if errno == EINTR { continue }
            if errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP { break }
            // Which side failed is not known here: the writer's errno, kept (ENOSPC, EROFS, EIO).
            throw LocalWriteError(errno: errno)
        }
        var buf = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = buf.withUnsafeMutableBytes { read(inp, $0.baseAddress, $0.count) }
            if n < 0 { if errno == EINTR { continue }; throw StoreError.unavailable("read: \(String(cString: strerror(errno)))") }
            if n == 0 { return total }
            var off = 0
            while off < n {
                let w = buf.withUnsafeBytes { write(out, $0.baseAddress! + off, n - off) }
                if w < 0 {
                    if errno == EINTR { continue }
                    throw LocalWriteError(errno: errno)
                }
                off += w
            }
            total += Int64(n)
            progress?(total)
        }
    }
}
