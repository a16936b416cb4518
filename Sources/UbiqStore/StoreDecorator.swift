import Foundation

/// A store that wraps another and hands it every call the wrapper does not shape itself: a
/// wrapper (counting, faults, a slow link, a prefix) names `inner` and writes only what it
/// changes.
///
/// Two calls are where content crosses, so that a wrapper that shapes content sees all of it:
/// - out: `put(_:contentsOf:metadata:condition:progress:)`; the `put` without progress calls it.
/// - in: `read(_:version:range:)`; the read into a file descriptor calls it (CloudStore's
///   default), unless the wrapper forwards that one too (a wrapper that leaves bytes as they
///   are, as `PrefixStore` does, lets the inner store copy without bringing them in).
public protocol StoreDecorator: CloudStore {
    var inner: any CloudStore { get }
}

extension StoreDecorator {
    public var keepsPriorVersions: Bool { inner.keepsPriorVersions }

    public func head(_ key: String) async throws -> ObjectInfo { try await inner.head(key) }
    public func list(prefix: String) async throws -> [ObjectInfo] { try await inner.list(prefix: prefix) }
    public func list(prefix: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
                     _ body: ([ObjectInfo]) throws -> Void) async throws {
        try await inner.list(prefix: prefix, pagesOf: size, wanted: wanted, body)
    }
    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        try await inner.read(key, version: version, range: range)
    }
    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition) async throws -> ObjectInfo {
        try await put(key, contentsOf: source, metadata: metadata, condition: condition, progress: nil)
    }
    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition, progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: progress)
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
    public func startingCursor(listingFirst objects: Int) async throws -> String {
        try await inner.startingCursor(listingFirst: objects)
    }
    public func versions(of key: String) async throws -> [ObjectInfo] { try await inner.versions(of: key) }
    public func usage() async throws -> StoreUsage? { try await inner.usage() }
    public func publishChanges(holdingMoves: Bool) async throws { try await inner.publishChanges(holdingMoves: holdingMoves) }
    public func lookEverywhereNext() { inner.lookEverywhereNext() }
    public func confirmed(_ changes: [StoreChange]) async -> [StoreChange] { await inner.confirmed(changes) }
}
