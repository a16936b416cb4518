import Foundation
import Synchronization

/// Wraps a store and limits how fast content comes from it (bytes per second, shared by
/// all reads), the way a slow link would. For tests and demonstrations: the daemon uses it
/// when UBIQ_STORE_READ_RATE is set (docs/testing.md).
public final class ThrottledStore: CloudStore, Sendable {
    public let inner: any CloudStore
    public var keepsPriorVersions: Bool { inner.keepsPriorVersions }
    public let bytesPerSecond: Double
    /// Upload rate (nil: not limited). Puts are slowed as the store reports their progress.
    public let writeBytesPerSecond: Double?
    /// Seconds every content read waits before it begins, each on its own (a far store).
    public let readLatency: Double
    /// When the link is next free (seconds since the reference date).
    private let nextFree = Mutex<Double>(0)

    public init(_ inner: any CloudStore, bytesPerSecond: Double, writeBytesPerSecond: Double? = nil, readLatency: Double = 0) {
        self.inner = inner
        self.bytesPerSecond = max(1, bytesPerSecond)
        self.writeBytesPerSecond = writeBytesPerSecond.map { max(1, $0) }
        self.readLatency = max(0, readLatency)
    }

    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        if readLatency > 0 { try await Task.sleep(nanoseconds: UInt64(readLatency * 1e9)) }
        let data = try await inner.read(key, version: version, range: range)
        let cost = Double(data.count) / bytesPerSecond
        let wait = nextFree.withLock { next -> Double in
            let now = Date().timeIntervalSinceReferenceDate
            let start = max(now, next)
            next = start + cost
            return next - now
        }
        if wait > 0 { try await Task.sleep(nanoseconds: UInt64(wait * 1e9)) }
        return data
    }

    public func head(_ key: String) async throws -> ObjectInfo { try await inner.head(key) }
    public func list(prefix: String) async throws -> [ObjectInfo] { try await inner.list(prefix: prefix) }
    public func list(prefix: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
                     _ body: ([ObjectInfo]) throws -> Void) async throws {
        try await inner.list(prefix: prefix, pagesOf: size, wanted: wanted, body)
    }
    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition) async throws -> ObjectInfo {
        try await put(key, contentsOf: source, metadata: metadata, condition: condition, progress: nil)
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition, progress outer: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        guard let rate = writeBytesPerSecond else {
            return try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: outer)
        }
        let start = Date()
        // The store reports what it has copied; each report waits until the link would have carried it.
        let slowed: @Sendable (Int64) -> Void = { sent in
            let due = Double(sent) / rate - Date().timeIntervalSince(start)
            if due > 0 { Thread.sleep(forTimeInterval: due) }
            outer?(sent)
        }
        return try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: slowed)
    }
    public func copy(from source: String, version: String, to destination: String,
                     metadata: ObjectMetadata?, condition: WriteCondition) async throws -> ObjectInfo {
        try await inner.copy(from: source, version: version, to: destination, metadata: metadata, condition: condition)
    }
    public func delete(_ key: String, condition: WriteCondition) async throws { try await inner.delete(key, condition: condition) }
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
