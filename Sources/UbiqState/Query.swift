import Foundation
import GRDB

/// What `ubiq query` asks (NSMetadataQuery's predicate, scope and sort), answered from
/// the state database by one recursive query: no walk of the mounted tree.
public struct QuerySpec: Sendable, Codable, Equatable {
    /// Shell glob on the item's name (case-sensitive, `*`, `?`, `[...]`).
    public var name: String?
    /// Depth below the scope folder: 1 = its direct children.
    public var minDepth: Int?
    public var maxDepth: Int?
    /// Any of these (docs/status.md).
    public var status: [SyncStatus]?
    /// `file`, `folder`, `symlink` or `other`.
    public var type: String?
    public var minSize: Int64?
    public var maxSize: Int64?
    /// Modification time bounds, nanoseconds since the epoch.
    public var modifiedAfter: Int64?
    public var modifiedBefore: Int64?
    /// `path` (default), `name`, `size` or `time`.
    public var sort: String?
    public var descending: Bool?
    public var limit: Int?
    public init() {}
}

/// One item a query found.
public struct QueryRow: Sendable, Codable, Equatable {
    public var ino: UInt64
    /// Path below the scope folder.
    public var path: String
    /// The path's bytes, when they are not valid UTF-8 (`path` then shows U+FFFD for what
    /// is not); nil otherwise.
    public var rawPath: [UInt8]?
    public var name: String
    public var depth: Int
    public var type: String
    public var size: Int64
    public var mtimeNs: Int64
    /// As in docs/status.md, except `downloading`, which only the daemon knows (it adjusts).
    public var status: SyncStatus
    public var pinned: Bool

    public init(ino: UInt64, path: String, rawPath: [UInt8]?, name: String, depth: Int, type: String, size: Int64,
                mtimeNs: Int64, status: SyncStatus, pinned: Bool) {
        self.ino = ino; self.path = path; self.rawPath = rawPath; self.name = name; self.depth = depth
        self.type = type; self.size = size; self.mtimeNs = mtimeNs; self.status = status; self.pinned = pinned
    }
}

extension StateTransaction {
    public static let sortKeys = ["path", "name", "size", "time"]

    /// Items under folder `scope` that match `q`, sorted, one row at a time until `each` says
    /// false. Status filtering is left to the caller, which knows what is downloading and
    /// what has a conflict copy; `among`, where given, are the only statuses the database's
    /// own may have (rows of other ones are not read: a query for the few items not synced
    /// among a million read them all). Read from a cursor, so that a query that matches a
    /// million items holds no row but the one at hand.
    public func query(scope: UInt64, _ q: QuerySpec, among: Set<SyncStatus>? = nil, each: (QueryRow) throws -> Bool) throws {
        var filters: [String] = []
        var args: [DatabaseValueConvertible?] = [Int64(bitPattern: scope), q.maxDepth]
        if let among {
            filters.append("status IN (\(among.map { "'\($0.rawValue)'" }.sorted().joined(separator: ",")))")
        }
        if let g = q.name { filters.append("name GLOB ?"); args.append(g) }
        if let d = q.minDepth { filters.append("depth >= ?"); args.append(d) }
        if let t = q.type {
            switch t {
            case "file": filters.append("type = \(S_IFREG)")
            case "folder": filters.append("type = \(S_IFDIR)")
            case "symlink": filters.append("type = \(S_IFLNK)")
            default: filters.append("type NOT IN (\(S_IFREG), \(S_IFDIR), \(S_IFLNK))")
            }
        }
        if let v = q.minSize { filters.append("size >= ?"); args.append(v) }
        if let v = q.maxSize { filters.append("size <= ?"); args.append(v) }
        if let v = q.modifiedAfter { filters.append("mtime > ?"); args.append(v) }
        if let v = q.modifiedBefore { filters.append("mtime < ?"); args.append(v) }
        let order: String
        switch q.sort ?? "path" {
        case "name": order = "name, path"
        case "size": order = "size, path"
        case "time": order = "mtime, path"
        default: order = "path"
        }
        let dir = (q.descending ?? false) ? " DESC" : ""
        // Folders first (a walk that builds only their paths), then the entries in them: a
        // filter on the entries' own columns is applied before their paths are built.
        let sql = """
            WITH RECURSIVE dirs(ino, path, depth) AS (
              SELECT ?1, '', 0
              UNION ALL
              SELECT e.ino, dirs.path || CAST(e.name AS TEXT) || '/', dirs.depth + 1
              FROM dirs JOIN entries e ON e.parent = dirs.ino JOIN inodes d ON d.ino = e.ino
              WHERE d.type = \(S_IFDIR) AND (?2 IS NULL OR dirs.depth + 1 < ?2)
            )
            SELECT * FROM (
              SELECT e.ino, CAST(dirs.path || CAST(e.name AS TEXT) AS BLOB) AS path, CAST(e.name AS TEXT) AS name,
                dirs.depth + 1 AS depth, i.type, i.size, i.mtime, i.pinned,
                \(SyncStatus.sqlCase) AS status
              FROM dirs JOIN entries e ON e.parent = dirs.ino JOIN inodes i ON i.ino = e.ino
              WHERE ?2 IS NULL OR dirs.depth < ?2
            )
            \(filters.isEmpty ? "" : "WHERE " + filters.joined(separator: " AND "))
            ORDER BY \(order.split(separator: ",").map { $0 + dir }.joined(separator: ","))
            """
        // A limit is applied by the caller, after the status filter.
        let rows = try Row.fetchCursor(db, sql: sql, arguments: StatementArguments(args))
        while let r = try rows.next() {
            let type: Int64 = r["type"]
            let t: String
            switch UInt32(type) {
            case UInt32(S_IFREG): t = "file"
            case UInt32(S_IFDIR): t = "folder"
            case UInt32(S_IFLNK): t = "symlink"
            default: t = "other"
            }
            let (path, rawPath) = PathText.of([UInt8]((r["path"] as Data?) ?? Data()))
            let row = QueryRow(ino: UInt64(bitPattern: r["ino"]), path: path, rawPath: rawPath, name: r["name"], depth: r["depth"], type: t,
                               size: t == "file" ? r["size"] : 0, mtimeNs: r["mtime"],
                               status: SyncStatus(rawValue: r["status"]) ?? .current, pinned: r["pinned"])
            guard try each(row) else { return }
        }
    }
}

/// A path as text for the CLI and the control socket: its text, and its bytes as well when
/// they are not valid UTF-8 (a name may be any bytes but "/" and NUL; the text alone would
/// lose them to U+FFFD).
public enum PathText {
    public static func of(_ bytes: [UInt8]) -> (text: String, raw: [UInt8]?) {
        if let s = String(validating: bytes, as: UTF8.self) { return (s, nil) }
        return (String(decoding: bytes, as: UTF8.self), bytes)
    }
}
