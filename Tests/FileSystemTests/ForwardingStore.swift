import Foundation
import UbiqStore

/// A store that hands every call to `inner`: a test's store subclasses it to shape the one
/// thing it changes (what the feed says, what it tells).
class ForwardingStore: CloudStore, @unchecked Sendable {
    let inner: any CloudStore
    init(_ inner: any CloudStore) { self.inner = inner }

    func head(_ key: String) async throws -> ObjectInfo { try await inner.head(key) }
    func list(prefix: String) async throws -> [ObjectInfo] { try await inner.list(prefix: prefix) }
    func list(prefix: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
              _ body: ([ObjectInfo]) throws -> Void) async throws {
        try await inner.list(prefix: prefix, pagesOf: size, wanted: wanted, body)
    }
    func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        try await inner.read(key, version: version, range: range)
    }
    func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata, condition: WriteCondition) async throws -> ObjectInfo {
        try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition)
    }
    func copy(from source: String, version: String, to destination: String, metadata: ObjectMetadata?,
              condition: WriteCondition) async throws -> ObjectInfo {
        try await inner.copy(from: source, version: version, to: destination, metadata: metadata, condition: condition)
    }
    func delete(_ key: String, condition: WriteCondition) async throws { try await inner.delete(key, condition: condition) }
    func deleteMoved(_ key: String, version: String, to destination: String) async throws {
        try await inner.deleteMoved(key, version: version, to: destination)
    }
    func changes(since cursor: String?, limit: Int) async throws -> ChangeBatch { try await inner.changes(since: cursor, limit: limit) }
    func confirmed(_ changes: [StoreChange]) async -> [StoreChange] { await inner.confirmed(changes) }
    func currentCursor() async throws -> String { try await inner.currentCursor() }
    func startingCursor(listingFirst objects: Int) async throws -> String { try await inner.startingCursor(listingFirst: objects) }
    func versions(of key: String) async throws -> [ObjectInfo] { try await inner.versions(of: key) }
    func usage() async throws -> StoreUsage? { try await inner.usage() }
}
