import Foundation
import GRDB

/// What the inode table reads at mount and when it reads a node in again: folders whole, files
/// one at a time or as totals, without building the whole table in memory.
extension StateTransaction {
    private static let dirType = Int64(S_IFDIR)
    private static let regType = Int64(S_IFREG)

    /// Every folder's record.
    public func directories() throws -> [InodeRecord] {
        try Row.fetchAll(db, cached: "SELECT \(Self.inodeColumns) FROM inodes WHERE type = ?", arguments: [Self.dirType])
            .map(Self.inodeRecord)
    }

    /// Removes names whose inode has no row, or whose folder is not a folder with a row (what a
    /// damaged database may hold). Returns how many.
    public func removeDanglingEntries() throws -> Int {
        try db.execute(cached: """
            DELETE FROM entries WHERE ino NOT IN (SELECT ino FROM inodes)
              OR parent NOT IN (SELECT ino FROM inodes WHERE type = ?)
            """, arguments: [Self.dirType])
        return db.changesCount
    }

    /// Calls `body` with every name (folder, name, inode, whether the inode is a folder), read
    /// as a stream.
    public func eachName(_ body: (UInt64, [UInt8], UInt64, Bool) throws -> Void) throws {
        let rows = try Row.fetchCursor(db.cachedStatement(sql: """
            SELECT e.parent, e.name, e.ino, i.type = ? FROM entries e JOIN inodes i ON i.ino = e.ino
            """), arguments: [Self.dirType])
        while let r = try rows.next() {
            try body(UInt64(bitPattern: r[0]), [UInt8](r[1] as Data), UInt64(bitPattern: r[2]), r[3])
        }
    }

    /// The extended attributes of every folder.
    public func directoryXattrs() throws -> [UInt64: [[UInt8]: [UInt8]]] {
        var out: [UInt64: [[UInt8]: [UInt8]]] = [:]
        for r in try Row.fetchAll(db, cached: """
            SELECT x.ino, x.name, x.value FROM xattrs x JOIN inodes i ON i.ino = x.ino WHERE i.type = ?
            """, arguments: [Self.dirType]) {
            out[UInt64(bitPattern: r[0]), default: [:]][[UInt8](r[1] as Data)] = [UInt8](r[2] as Data)
        }
        return out
    }

    /// Inodes other than the root with no name (open-unlinked when the last run ended).
    public func namelessInodes() throws -> [UInt64] {
        try Int64.fetchAll(db, cached: """
            SELECT ino FROM inodes WHERE ino != 1 AND NOT EXISTS (SELECT 1 FROM entries e WHERE e.ino = inodes.ino)
            """).map { UInt64(bitPattern: $0) }
    }

    /// Every regular file whose content is held here, with its recorded size; `unpinned`: only
    /// those not pinned themselves (what the cache limit may evict, by its rows).
    /// (Read row by row: a `Row` each, as `fetchAll` makes, was most of a mount's peak memory
    /// at a million files.)
    public func presentFiles(unpinned: Bool = false) throws -> [(ino: UInt64, size: Int64)] {
        let rows = try Row.fetchCursor(db.cachedStatement(sql: "SELECT ino, size FROM inodes WHERE type = ? AND present" + (unpinned ? " AND NOT pinned" : "")),
                                       arguments: [Self.regType])
        var out: [(ino: UInt64, size: Int64)] = []
        while let r = try rows.next() { out.append((UInt64(bitPattern: r[0]), r[1])) }
        return out
    }

    /// Regular files held here in full (`present`), or placeholders, or (nil) both.
    public func regularFiles(present: Bool?) throws -> [UInt64] {
        guard let present else {
            return try Int64.fetchAll(db, cached: "SELECT ino FROM inodes WHERE type = ?", arguments: [Self.regType])
                .map { UInt64(bitPattern: $0) }
        }
        return try Int64.fetchAll(db, cached: "SELECT ino FROM inodes WHERE type = ? AND present = ?", arguments: [Self.regType, present])
            .map { UInt64(bitPattern: $0) }
    }

    /// How many of `inos` are placeholders (regular files whose bytes are not here), each as
    /// many times as it is named there (its hard links), read as a stream of the placeholders'
    /// numbers.
    public func placeholderCount(among inos: [UInt64: Int]) throws -> Int {
        guard !inos.isEmpty else { return 0 }
        let rows = try Int64.fetchCursor(db.cachedStatement(sql: "SELECT ino FROM inodes WHERE type = ? AND NOT present"),
                                         arguments: [Self.regType])
        var n = 0
        while let i = try rows.next() {
            n += inos[UInt64(bitPattern: i)] ?? 0
        }
        return n
    }

    /// Whether any of `inos` is a placeholder: asked of those rows by number when they are few,
    /// else read as a stream of the placeholders' numbers that stops at the first of them.
    public func anyPlaceholder(among inos: Set<UInt64>) throws -> Bool {
        guard !inos.isEmpty else { return false }
        if inos.count <= 500 {
            let list = inos.map { String(Int64(bitPattern: $0)) }.joined(separator: ",")
            return try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM inodes WHERE ino IN (\(list)) AND type = ? AND NOT present)",
                                     arguments: [Self.regType]) ?? false
        }
        let rows = try Int64.fetchCursor(db.cachedStatement(sql: "SELECT ino FROM inodes WHERE type = ? AND NOT present"),
                                         arguments: [Self.regType])
        while let i = try rows.next() {
            if inos.contains(UInt64(bitPattern: i)) { return true }
        }
        return false
    }

    /// The sum of present regular files' sizes.
    public func presentBytes() throws -> Int64 {
        try Int64.fetchOne(db, cached: "SELECT coalesce(sum(size), 0) FROM inodes WHERE type = ? AND present",
                           arguments: [Self.regType]) ?? 0
    }

    /// How many inodes there are.
    public func inodeCount() throws -> Int {
        try Int.fetchOne(db, cached: "SELECT count(*) FROM inodes") ?? 0
    }

    /// Every inode number.
    public func inodeNumbers() throws -> Set<UInt64> {
        var out = Set<UInt64>()
        let rows = try Int64.fetchCursor(db.cachedStatement(sql: "SELECT ino FROM inodes"))
        while let i = try rows.next() { out.insert(UInt64(bitPattern: i)) }
        return out
    }

    /// Items pinned themselves ("keep downloaded").
    public func pinnedInodes() throws -> [UInt64] {
        try Int64.fetchAll(db, cached: "SELECT ino FROM inodes WHERE pinned").map { UInt64(bitPattern: $0) }
    }

    /// How many names `ino` has.
    public func nameCount(of ino: UInt64) throws -> Int {
        try Int.fetchOne(db, cached: "SELECT count(*) FROM entries WHERE ino = ?", arguments: [Int64(bitPattern: ino)]) ?? 0
    }

    /// The records of the items in the folder `parent` that are not folders, each with its
    /// count of names and its xattrs (a folder's listing read in at once).
    public func childFiles(of parent: UInt64) throws -> [(rec: InodeRecord, names: Int, xattrs: [[UInt8]: [UInt8]])] {
        let p = Int64(bitPattern: parent)
        var attrs: [UInt64: [[UInt8]: [UInt8]]] = [:]
        for r in try Row.fetchAll(db, cached: """
            SELECT DISTINCT x.ino, x.name, x.value FROM entries e JOIN xattrs x ON x.ino = e.ino WHERE e.parent = ?
            """, arguments: [p]) {
            attrs[UInt64(bitPattern: r[0]), default: [:]][[UInt8](r[1] as Data)] = [UInt8](r[2] as Data)
        }
        var seen = Set<UInt64>()
        return try Row.fetchAll(db, cached: """
            SELECT \(Self.inodeColumns("i.")), (SELECT count(*) FROM entries n WHERE n.ino = i.ino)
              FROM entries e JOIN inodes i ON i.ino = e.ino WHERE e.parent = ? AND i.type != ?
            """, arguments: [p, Self.dirType]).compactMap { r in
            let rec = Self.inodeRecord(r)
            guard seen.insert(rec.ino).inserted else { return nil }  // two names here of one file
            return (rec, r[15], attrs[rec.ino] ?? [:])
        }
    }

    /// The type (`st_mode & S_IFMT`) of each item in the folder `parent`, by inode.
    public func childTypes(of parent: UInt64) throws -> [UInt64: UInt32] {
        var out: [UInt64: UInt32] = [:]
        for r in try Row.fetchAll(db, cached: """
            SELECT e.ino, i.type FROM entries e JOIN inodes i ON i.ino = e.ino WHERE e.parent = ?
            """, arguments: [Int64(bitPattern: parent)]) {
            out[UInt64(bitPattern: r[0])] = r[1]
        }
        return out
    }
}
