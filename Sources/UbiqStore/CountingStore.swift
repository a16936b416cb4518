import Foundation
import Synchronization

/// Wraps a store and counts what crosses it, so a test can say "opening the
/// placeholder fetched 4 MiB" or "ls -lR read no content".
public final class CountingStore: CloudStore, Sendable {
    public let inner: any CloudStore
    public var keepsPriorVersions: Bool { inner.keepsPriorVersions }
    private let counters = Mutex<(reads: Int, bytesRead: Int64, puts: Int, heads: Int)>((0, 0, 0, 0))
    private let reading = Mutex<(now: Int, most: Int)>((0, 0))

    public init(_ inner: any CloudStore) { self.inner = inner }

    public var reads: Int { counters.withLock { $0.reads } }
    public var bytesRead: Int64 { counters.withLock { $0.bytesRead } }
    public var puts: Int { counters.withLock { $0.puts } }
    public var heads: Int { counters.withLock { $0.heads } }
    /// The most content reads that were under way at one time.
    public var mostReadsAtOnce: Int { reading.withLock { $0.most } }

    public func head(_ key: String) async throws -> ObjectInfo {
        counters.withLock { $0.heads += 1 }
        return try await inner.head(key)
    }
    public func list(prefix: String) async throws -> [ObjectInfo] { try await inner.list(prefix: prefix) }
    public func list(prefix: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
                     _ body: ([ObjectInfo]) throws -> Void) async throws {
        try await inner.list(prefix: prefix, pagesOf: size, wanted: wanted, body)
    }

    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        reading.withLock { $0.now += 1; $0.most = max($0.most, $0.now) }
        defer { reading.withLock { $0.now -= 1 } }
        let d = try await inner.read(key, version: version, range: range)
        counters.withLock { $0.reads += 1; $0.bytesRead += Int64(d.count) }
        return d
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition) async throws -> ObjectInfo {
        counters.withLock { $0.puts += 1 }
        return try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition)
    }

    public func copy(from source: String, version: String, to destination: String,
                     metadata: ObjectMetadata?, condition: WriteCondition) async throws -> ObjectInfo {
        try await inner.copy(from: source, version: version, to: destination, metadata: metadata, condition: condition)
    }

    public func delete(_ key: String, condition: WriteCondition) async throws {
        try await inner.delete(key, condition: condition)
    }

    public func deleteMoved(_ key: String, version: String, to destination: String) async throws {
        try await inner.deleteMoved(key, version: version, to: destination)
    }

    public func changes(since cursor: String?, limit: Int) async throws -> ChangeBatch {
        try await inner.changes(since: cursor, limit: limit)
    }

    public func currentCursor() async throws -> String { try await inner.currentCursor() }
    public func startingCursor(listingFirst objects: Int) async throws -> String { try await inner.startingCursor(listingFirst: objects) }
    public func versions(of key: String) async throws -> [ObjectInfo] { try await inner.versions(of: key) }
    public func usage() async throws -> StoreUsage? { try await inner.usage() }
    public func publishChanges(holdingMoves: Bool) async throws { try await inner.publishChanges(holdingMoves: holdingMoves) }
    public func lookEverywhereNext() { inner.lookEverywhereNext() }
    public func confirmed(_ changes: [StoreChange]) async -> [StoreChange] { await inner.confirmed(changes) }
}
