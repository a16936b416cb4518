import Foundation
import GRDB
import UbiqStore

/// What this device remembers of a bucket, in SQLite beside its state:
/// - `known`: what a HEAD (or a snapshot) said of each object as of a listing stamp (ETag, time,
///   size), so a listing needs a HEAD only for objects that changed since; keys the last full
///   listing did not show are dropped;
/// - `feed`: the listing the change feed last saw, to tell the next one's changes from, and the
///   keys the change log told of puts of since;
/// - `parts`: part uploads under way (multipart journal);
/// - `unlogged`: keys this device wrote (or tried to) that no log object of its names yet
///   (ChangeLog): a crash between a write and its log object loses no entry;
/// - `claimed`: what the change log says puts wrote (this device's and others'), and when,
///   until a full listing has shown them (`S3Store.tellKnown`);
/// - `deferred`: deletes a move implies that wait for the move's log object (`S3Store.delete`),
///   with the version each may delete: a crash between the two does not leave the old key.
///
/// WAL with `synchronous = NORMAL`: a commit survives a killed daemon (as the state database's
/// do), without waiting for the disk: one is made before every write to the bucket.
final class S3Index: MultipartJournal, @unchecked Sendable {
    private let db: DatabaseQueue
    /// Names this index: a cursor from another index (removed, remade) is never taken for one of this.
    let id: String

    init(path: String) throws {
        // Object names and sizes of the bucket: for this user's eyes only.
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        if fd >= 0 { fchmod(fd, 0o600); close(fd) }
        do {
            var config = Configuration()
            config.prepareDatabase { db in try db.execute(sql: "PRAGMA synchronous = NORMAL") }
            db = try DatabaseQueue(path: path, configuration: config)
            try db.writeWithoutTransaction { db in _ = try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL") }
            var m = DatabaseMigrator()
            m.registerMigration("v1") { db in
                try db.execute(sql: """
                    CREATE TABLE known (key TEXT PRIMARY KEY, stamp TEXT NOT NULL, version TEXT NOT NULL,
                                        size INTEGER NOT NULL, meta BLOB NOT NULL, tag TEXT);
                    CREATE TABLE feed (key TEXT PRIMARY KEY, stamp TEXT NOT NULL);
                    CREATE TABLE parts (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, upload TEXT NOT NULL);
                    CREATE TABLE settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
                    """)
                try db.execute(sql: "INSERT INTO settings VALUES ('id', ?), ('generation', '0')",
                               arguments: [UUID().uuidString.lowercased().prefix(8).description])
            }
            m.registerMigration("v2") { db in
                // One row a key (the latest write's): a key written many times while the log
                // could not be written is one entry to publish.
                try db.execute(sql: "CREATE TABLE unlogged (id INTEGER PRIMARY KEY, op TEXT NOT NULL, key TEXT NOT NULL UNIQUE)")
            }
            m.registerMigration("v3") { db in
                // What the change log says puts wrote (this device's and others'), and when (the
                // server's ms): the next full listing takes one its listing bears out without a HEAD.
                try db.execute(sql: """
                    CREATE TABLE claimed (key TEXT PRIMARY KEY, version TEXT NOT NULL, size INTEGER NOT NULL,
                                          meta BLOB NOT NULL, tag TEXT, at INTEGER NOT NULL)
                    """)
            }
            m.registerMigration("v4") { db in
                try db.execute(sql: "CREATE TABLE deferred (key TEXT PRIMARY KEY, version TEXT NOT NULL)")
            }
            try m.migrate(db)
            id = try db.read { try String.fetchOne($0, sql: "SELECT value FROM settings WHERE name = 'id'") } ?? "?"
        } catch {
            throw StoreError.failed("cannot open the S3 index at \(path): \(error)")
        }
    }

    private func run<T>(_ body: (Database) throws -> T) throws -> T {
        do { return try db.write(body) } catch let e as StoreError { throw e } catch {
            throw StoreError.failed("the S3 index: \(error)")
        }
    }

    func setting(_ name: String) throws -> String? {
        try run { try String.fetchOne($0, sql: "SELECT value FROM settings WHERE name = ?", arguments: [name]) }
    }

    func setSetting(_ name: String, _ value: String) throws {
        try run { try $0.execute(sql: "INSERT OR REPLACE INTO settings VALUES (?, ?)", arguments: [name, value]) }
    }

    func removeSetting(_ name: String) throws {
        try run { try $0.execute(sql: "DELETE FROM settings WHERE name = ?", arguments: [name]) }
    }

    // MARK: metadata

    /// How many of these objects are not known at their stamps (`known` would leave out).
    func unknownCount(_ objects: [ListedObject]) throws -> Int {
        try run { db in
            let stmt = try db.cachedStatement(sql: "SELECT stamp FROM known WHERE key = ?")
            var n = 0
            for o in objects where try String.fetchOne(stmt, arguments: [o.key]) != o.stamp { n += 1 }
            return n
        }
    }

    /// What is known of these objects at these stamps.
    func known(_ objects: some Collection<ListedObject>) throws -> [KeyBytes: ObjectInfo] {
        try run { db in
            var out: [KeyBytes: ObjectInfo] = [:]
            let stmt = try db.cachedStatement(sql: "SELECT stamp, version, size, meta, tag FROM known WHERE key = ?")
            for o in objects {
                guard let row = try Row.fetchOne(stmt, arguments: [o.key]), row["stamp"] as String == o.stamp,
                      let info = Self.info(row, key: o.key) else { continue }
                out[KeyBytes(o.key)] = info
            }
            return out
        }
    }

    /// An object as a row of `known` or `claimed` holds it (nil: metadata that does not decode).
    private static func info(_ row: Row, key: String) -> ObjectInfo? {
        guard let meta = try? ObjectMetadata.read(json: row["meta"] as Data) else { return nil }
        return ObjectInfo(key: key, version: row["version"], size: row["size"], metadata: meta, contentTag: row["tag"])
    }

    /// Remembers what each object is at its listing stamp.
    func remember(_ pairs: [(stamp: String, info: ObjectInfo)]) throws {
        guard !pairs.isEmpty else { return }
        try run { db in
            let stmt = try db.cachedStatement(sql: "INSERT OR REPLACE INTO known VALUES (?, ?, ?, ?, ?, ?)")
            for (stamp, i) in pairs {
                try stmt.execute(arguments: [i.key, stamp, i.version, i.size, i.metadata.json, i.contentTag])
            }
        }
    }

    // MARK: change feed

    func cursor(_ generation: Int) -> String { "\(id):\(generation)" }

    /// The feed's generation: each look at the store makes the next, and names its cursor.
    private static func generation(_ db: Database) throws -> Int {
        Int(try String.fetchOne(db, sql: "SELECT value FROM settings WHERE name = 'generation'") ?? "0") ?? 0
    }

    private static func setGeneration(_ db: Database, _ generation: Int) throws {
        try db.execute(sql: "UPDATE settings SET value = ? WHERE name = 'generation'", arguments: ["\(generation)"])
    }

    /// Compares `listing` with the feed's last one when `since` is its cursor (nil: with
    /// nothing), records it as the feed's, and returns the changes and the new cursor; nil
    /// when `since` is not this index's latest cursor (the caller starts over).
    /// Objects modified within `unsettled` of the listing may yet change again within the
    /// same second unseen (S3 times are in seconds): they count as changed once more next time.
    /// `stableFolders`: a folder marker's time is not part of its state (a server that drops its
    /// metadata changes that time whenever something is added inside it).
    /// The listing and the last one's rows are walked side by side in key order, the rows
    /// `pageRows` at a time: what is held is the listing alone, where the last listing's stamps
    /// as a dictionary and a set of the keys seen were held beside it (a million listed objects
    /// compared again: 2.4 s where it took 5.9, and 96 MiB resident after it where 408 stayed).
    /// Keys are compared as bytes (NFC and NFD spellings of one name are two keys), as SQLite
    /// compares text.
    /// `tell`: whether the changes are wanted (a cursor alone, at a fresh mount, is a million
    /// objects' changes not made: 650 bytes each, most of that mount's peak memory).
    /// A listing of the first part only (`Listing.through`: a fresh device's first) is recorded
    /// as far as it went: the next listing's keys past it are told only where
    /// `quietPastFirstPart` is false (see `S3Store.listEverything`); any others as ever.
    func advance(since: String?, to listing: Listing, unsettled: TimeInterval = 2,
                 stableFolders: Bool = false, pageRows: Int = 10_000, tell: Bool = true,
                 quietPastFirstPart: Bool = false) throws -> (changes: [StoreChange], cursor: String)? {
        try run { db in
            let gen = try Self.generation(db)
            if let since, since != cursor(gen) { return nil }
            // Where the listing `since` names stopped, when it was a first part.
            let part = since == nil ? nil : try String.fetchOne(db, sql: "SELECT value FROM settings WHERE name = ?",
                                                                arguments: [Self.firstPartSetting])
            let quietPast = quietPastFirstPart ? part : nil
            if let through = listing.through {
                try db.execute(sql: "INSERT OR REPLACE INTO settings VALUES (?, ?)", arguments: [Self.firstPartSetting, through])
            } else {
                try db.execute(sql: "DELETE FROM settings WHERE name = ?", arguments: [Self.firstPartSetting])
            }
            let precedes = { (a: String, b: String) in a.utf8.lexicographicallyPrecedes(b.utf8) }
            var objects = listing.objects  // in order already (`listAll`); sorted here if not
            if zip(objects, objects.dropFirst()).contains(where: { precedes($1.key, $0.key) }) {
                objects.sort { precedes($0.key, $1.key) }
            }
            let page = try db.cachedStatement(sql: "SELECT key, stamp FROM feed WHERE key > ? ORDER BY key LIMIT ?")
            let put = try db.cachedStatement(sql: "INSERT OR REPLACE INTO feed VALUES (?, ?)")
            let del = try db.cachedStatement(sql: "DELETE FROM feed WHERE key = ?")
            var rows: [(key: String, stamp: String)] = []
            var r = 0
            var more = true
            // Rows are read past the last page's last key: a row written meanwhile is for a key at
            // or before it, never read again.
            var after = ""
            var changes: [StoreChange] = []
            var i = 0
            var previous: String?
            while true {
                if r == rows.count && more {
                    rows = try Row.fetchAll(page, arguments: [after, pageRows]).map { ($0["key"], $0["stamp"]) }
                    r = 0
                    more = rows.count == pageRows
                    if let last = rows.last { after = last.key }
                }
                // A key listed twice (a server that repeats a page) counts once.
                while i < objects.count, let p = previous, objects[i].key.sameBytes(p) { i += 1 }
                let row = r < rows.count ? rows[r] : nil
                guard i < objects.count else {
                    guard let row else { break }
                    // Not listed: gone (from nothing, whatever the table held is not this listing).
                    if tell && since != nil { changes.append(StoreChange(kind: .delete, key: row.key, version: nil)) }
                    try del.execute(arguments: [row.key])
                    r += 1
                    continue
                }
                let o = objects[i]
                if let row, precedes(row.key, o.key) {
                    if tell && since != nil { changes.append(StoreChange(kind: .delete, key: row.key, version: nil)) }
                    try del.execute(arguments: [row.key])
                    r += 1
                    continue
                }
                var held: String?
                if let row, row.key.sameBytes(o.key) {
                    held = row.stamp
                    r += 1
                }
                previous = o.key
                i += 1
                let folder = stableFolders && o.key.hasSuffix("/")
                let settled = folder || (o.modified.map { listing.taken.timeIntervalSince($0) >= unsettled } ?? true)
                let full = folder ? "\(o.etag)||\(o.size)" : o.stamp
                let stamp = settled ? full : ""
                let quiet = held == nil && quietPast.map { precedes($0, o.key) } == true
                if tell, !quiet, (since == nil ? nil : held) != full { changes.append(StoreChange(kind: .put, key: o.key, version: nil)) }
                if held != stamp { try put.execute(arguments: [o.key, stamp]) }
            }
            // What is known of keys no longer listed (deleted, or learned from a snapshot and
            // never here) is of no use: the table stays the bucket's size. (A first part says
            // nothing of the keys past it: what a snapshot said of them stays for the rest.)
            if listing.through == nil { try db.execute(sql: "DELETE FROM known WHERE key NOT IN (SELECT key FROM feed)") }
            try Self.setGeneration(db, gen + 1)
            return (changes, cursor(gen + 1))
        }
    }

    /// Whether the feed never looked at the bucket through this index (a fresh device's).
    func neverListed() throws -> Bool {
        try run { try Self.generation($0) == 0 }
    }

    /// The setting of where the last listing stopped, when it was a first part.
    static let firstPartSetting = "first-part-through"

    /// Whether `since` is the latest cursor.
    func isLatest(_ since: String) throws -> Bool {
        try run { db in
            let gen = try Self.generation(db)
            return since == cursor(gen)
        }
    }

    /// The cursor after `since` when the listing stays as it was (a look at the change log);
    /// nil when `since` is not the latest cursor. The keys the log told of a put of (`told`)
    /// join the listing's rows where they are not among them (as unsettled: the next listing
    /// tells them as changed where it shows them, as it would a key new to it), so that one the
    /// next full listing lacks is told as gone. Else a file this device learned of from the log
    /// and whose delete it never read (a log object lost, a device away for longer than the log
    /// is kept) stayed here for good: no listing had shown it, so none told it was gone.
    func nextGeneration(since: String, told: [String] = []) throws -> String? {
        try run { db in
            let gen = try Self.generation(db)
            guard since == cursor(gen) else { return nil }
            let track = try db.cachedStatement(sql: "INSERT OR IGNORE INTO feed VALUES (?, '')")
            for key in told { try track.execute(arguments: [key]) }
            try Self.setGeneration(db, gen + 1)
            return cursor(gen + 1)
        }
    }

    // MARK: unlogged writes

    /// Notes that this device is about to write `key` (`op`: the log entry's); the row's id,
    /// nil if it could not be noted (the write goes on: its entry is only not crash-proof).
    func noteUnlogged(op: String, key: String) -> Int64? {
        try? run { db in
            try db.execute(sql: "INSERT OR REPLACE INTO unlogged (op, key) VALUES (?, ?)", arguments: [op, key])
            return db.lastInsertedRowID
        }
    }

    /// The writes no log object names yet, oldest first.
    func unlogged() -> [(id: Int64, op: String, key: String)] {
        (try? run { db in
            try Row.fetchAll(db, sql: "SELECT id, op, key FROM unlogged ORDER BY id").map { ($0["id"], $0["op"], $0["key"]) }
        }) ?? []
    }

    /// Notes that the delete of `key` (if it still holds `version`) waits for its move's log
    /// object; whether that was noted (if not, the delete is made at once).
    func noteDeferred(key: String, version: String) -> Bool {
        (try? run { db in
            try db.execute(sql: "INSERT OR REPLACE INTO deferred VALUES (?, ?)", arguments: [key, version])
        }) != nil
    }

    /// The deletes that wait for their move's log object.
    func deferred() -> [(key: String, version: String)] {
        (try? run { db in
            try Row.fetchAll(db, sql: "SELECT key, version FROM deferred").map { ($0["key"], $0["version"]) }
        }) ?? []
    }

    /// The deferred delete of `key` was made (or refused): it no longer waits.
    func forgetDeferred(key: String) {
        try? run { db in try db.execute(sql: "DELETE FROM deferred WHERE key = ?", arguments: [key]) }
    }

    /// A log object holds these entries of this device's now: their writes are no longer
    /// unlogged, and what each put wrote is kept for the next full listing (`claimed`).
    func logged(_ entries: [ChangeLog.Entry]) {
        guard !entries.isEmpty else { return }
        try? run { db in
            let forget = try db.cachedStatement(sql: "DELETE FROM unlogged WHERE id = ?")
            for e in entries { if let row = e.row { try forget.execute(arguments: [row]) } }
            try Self.claim(entries.map { ($0.key, $0.claimed, $0.at) }, db)
        }
    }

    /// Keeps what the log says these puts wrote, in order (a change that says nothing of what
    /// it wrote, a delete among them, drops what was kept of its key). Two puts of one key whose
    /// times are within `ambiguous` ms of each other keep nothing: a listing could not tell them
    /// apart (the same bytes with other metadata, in one second), so the key gets its HEAD.
    func claim(_ changes: [(key: String, claimed: ObjectInfo?, at: Int64?)]) throws {
        guard !changes.isEmpty else { return }
        try run { try Self.claim(changes, $0) }
    }

    static let ambiguous: Int64 = 2000

    private static func claim(_ changes: [(key: String, claimed: ObjectInfo?, at: Int64?)], _ db: Database) throws {
        let keep = try db.cachedStatement(sql: "INSERT OR REPLACE INTO claimed VALUES (?, ?, ?, ?, ?, ?)")
        let drop = try db.cachedStatement(sql: "DELETE FROM claimed WHERE key = ?")
        let kept = try db.cachedStatement(sql: "SELECT version, at FROM claimed WHERE key = ?")
        for (key, c, at) in changes {
            if let c, let at {
                let meta = c.metadata.json
                if let row = try Row.fetchOne(kept, arguments: [key]), row["version"] as String != c.version,
                   abs((row["at"] as Int64) - at) <= ambiguous {
                    try drop.execute(arguments: [key])
                } else {
                    try keep.execute(arguments: [key, c.version, c.size, meta, c.contentTag, at])
                }
            } else {
                try drop.execute(arguments: [key])
            }
        }
    }

    /// What the log last said a put of each of these keys wrote, and when (the server's ms).
    func claims(_ keys: some Collection<String>) throws -> [KeyBytes: (info: ObjectInfo, at: Int64)] {
        try run { db in
            var out: [KeyBytes: (info: ObjectInfo, at: Int64)] = [:]
            let any = try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM claimed)") ?? false
            if keys.isEmpty || !any { return out }
            let stmt = try db.cachedStatement(sql: "SELECT version, size, meta, tag, at FROM claimed WHERE key = ?")
            for key in keys {
                guard let row = try Row.fetchOne(stmt, arguments: [key]), let info = Self.info(row, key: key) else { continue }
                out[KeyBytes(key)] = (info, row["at"])
            }
            return out
        }
    }

    /// Forgets what `claimed` holds of `keys` (a full listing has reported them) and of puts
    /// before `before` (ms; any full listing since has shown them).
    /// (The table holds what changed since the last full listing: it is walked, not `keys`,
    /// which are a whole bucket at a first listing.)
    func forgetClaims(_ keys: Set<KeyBytes>, before: Int64) throws {
        try run { db in
            let stmt = try db.cachedStatement(sql: "DELETE FROM claimed WHERE key = ?")
            for key in try String.fetchAll(db, sql: "SELECT key FROM claimed") where keys.contains(KeyBytes(key)) {
                try stmt.execute(arguments: [key])
            }
            try db.execute(sql: "DELETE FROM claimed WHERE at < ?", arguments: [before])
        }
    }

    // MARK: MultipartJournal

    func upload(key: String) -> (id: String, fingerprint: String)? {
        (try? run { db in
            try Row.fetchOne(db, sql: "SELECT upload, fingerprint FROM parts WHERE key = ?", arguments: [key])
        })?.flatMap { ($0["upload"], $0["fingerprint"]) }
    }

    func started(key: String, fingerprint: String, uploadID: String) {
        try? run { db in try db.execute(sql: "INSERT OR REPLACE INTO parts VALUES (?, ?, ?)", arguments: [key, fingerprint, uploadID]) }
    }

    func finished(key: String) {
        try? run { db in try db.execute(sql: "DELETE FROM parts WHERE key = ?", arguments: [key]) }
    }
}
