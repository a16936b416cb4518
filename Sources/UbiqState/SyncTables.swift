import Foundation
import GRDB

// The change feed's pending keys, the key-value store, and partial downloads.
extension StateTransaction {
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
}
