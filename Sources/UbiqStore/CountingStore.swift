import Foundation
import Synchronization

/// Wraps a store and counts what crosses it, so a test can say "opening the
/// placeholder fetched 4 MiB" or "ls -lR read no content".
public final class CountingStore: StoreDecorator, Sendable {
    public let inner: any CloudStore
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

    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        reading.withLock { $0.now += 1; $0.most = max($0.most, $0.now) }
        defer { reading.withLock { $0.now -= 1 } }
        let d = try await inner.read(key, version: version, range: range)
        counters.withLock { $0.reads += 1; $0.bytesRead += Int64(d.count) }
        return d
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition, progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        counters.withLock { $0.puts += 1 }
        return try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: progress)
    }
}
