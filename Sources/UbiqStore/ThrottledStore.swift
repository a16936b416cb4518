import Foundation
import UbiqClock
import Synchronization

/// Wraps a store and limits how fast content comes from it (bytes per second, shared by
/// all reads), the way a slow link would. For tests and demonstrations: the daemon uses it
/// when UBIQ_STORE_READ_RATE is set (docs/testing.md).
public final class ThrottledStore: StoreDecorator, Sendable {
    public let inner: any CloudStore
    public let bytesPerSecond: Double
    /// Upload rate (nil: not limited). Puts are slowed as the store reports their progress.
    public let writeBytesPerSecond: Double?
    /// Seconds every content read waits before it begins, each on its own (a far store).
    public let readLatency: Double
    /// When the link is next free (seconds on `clock`).
    private let nextFree = Mutex<Double>(0)
    private let clock = Stopwatch()

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
            let now = clock.seconds
            let start = max(now, next)
            next = start + cost
            return next - now
        }
        if wait > 0 { try await Task.sleep(nanoseconds: UInt64(wait * 1e9)) }
        return data
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition, progress outer: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        guard let rate = writeBytesPerSecond else {
            return try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: outer)
        }
        let started = Stopwatch()
        // The store reports what it has copied; each report waits until the link would have carried it.
        let slowed: @Sendable (Int64) -> Void = { sent in
            let due = Double(sent) / rate - started.seconds
            if due > 0 { Thread.sleep(forTimeInterval: due) }
            outer?(sent)
        }
        return try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: slowed)
    }
}
