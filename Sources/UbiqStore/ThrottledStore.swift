import Foundation
import UbiqClock
import Synchronization

/// One direction of a link that carries `bytesPerSecond`, shared by every transfer that crosses
/// it: each reserves the time its bytes take after those reserved before, and waits for it.
public final class LinkPace: Sendable {
    public let bytesPerSecond: Double
    /// When the link is next free (seconds on the caller's clock).
    private let nextFree = Mutex<Double>(0)

    public init(bytesPerSecond: Double) { self.bytesPerSecond = max(1, bytesPerSecond) }

    /// Reserves the link for `bytes` at `now` (seconds); how long the caller waits before they
    /// are through.
    public func reserve(_ bytes: Int64, now: Double) -> Double {
        let cost = Double(max(0, bytes)) / bytesPerSecond
        return nextFree.withLock { next in
            let start = max(now, next)
            next = start + cost
            return next - now
        }
    }
}

/// Wraps a store and limits how fast content comes from it and goes to it (bytes per second,
/// each way shared by all transfers), the way a slow link would: the mount's `--bwlimit`, and
/// for tests and demonstrations UBIQ_STORE_READ_RATE and its kin (docs/testing.md).
public final class ThrottledStore: StoreDecorator, Sendable {
    public let inner: any CloudStore
    /// Seconds every content read waits before it begins, each on its own (a far store).
    public let readLatency: Double
    /// Each way of the link, shared by all transfers (`up` nil: uploads are not limited; puts
    /// are slowed as the store reports their progress).
    private let down: LinkPace
    private let up: LinkPace?
    private let clock = Stopwatch()

    public init(_ inner: any CloudStore, bytesPerSecond: Double, writeBytesPerSecond: Double? = nil, readLatency: Double = 0) {
        self.inner = inner
        self.readLatency = max(0, readLatency)
        down = LinkPace(bytesPerSecond: bytesPerSecond)
        up = writeBytesPerSecond.map(LinkPace.init(bytesPerSecond:))
    }

    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        if readLatency > 0 { try await Task.sleep(nanoseconds: UInt64(readLatency * 1e9)) }
        let data = try await inner.read(key, version: version, range: range)
        let wait = down.reserve(Int64(data.count), now: clock.seconds)
        if wait > 0 { try await Task.sleep(nanoseconds: UInt64(wait * 1e9)) }
        return data
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition, progress outer: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        guard let up else {
            return try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: outer)
        }
        // The store reports what it has sent; each report waits until the link, shared with every
        // other upload, would have carried it. What it did not report is paid for at the end.
        let reported = Mutex<Int64>(0)
        let clock = self.clock
        let slowed: @Sendable (Int64) -> Void = { sent in
            let delta = reported.withLock { last in defer { last = max(last, sent) }; return sent - last }
            let due = up.reserve(delta, now: clock.seconds)
            if due > 0 { Thread.sleep(forTimeInterval: due) }
            outer?(sent)
        }
        let info = try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: slowed)
        let rest = info.size - reported.withLock { $0 }
        let due = up.reserve(rest, now: clock.seconds)
        if due > 0 { try await Task.sleep(nanoseconds: UInt64(due * 1e9)) }
        return info
    }
}
