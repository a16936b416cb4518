import Foundation

/// What time it is, for the parts that decide by it: when an upload is due (its delay, its
/// retries), when the uploader pauses, when a claim gives up. The daemon uses the system's
/// (`SystemTime`); a test moves a `ManualTime` itself, so what waits for time waits for the
/// test, not for a sleep.
public protocol TimeSource: Sendable {
    var now: Date { get }
    /// Waits on `condition` (locked by the caller, as `NSCondition.wait` wants) until it is
    /// signalled or `deadline` has passed by this clock. False when the deadline has passed.
    func wait(_ condition: NSCondition, until deadline: Date) -> Bool
}

/// The system's clock.
public struct SystemTime: TimeSource {
    public init() {}
    public var now: Date { Date() }
    public func wait(_ condition: NSCondition, until deadline: Date) -> Bool { condition.wait(until: deadline) }
}

/// A clock that stands still until `advance` moves it.
public final class ManualTime: TimeSource, @unchecked Sendable {
    private let lock = NSLock()
    private var current: Date

    public init(_ start: Date = Date(timeIntervalSince1970: 1_800_000_000)) { current = start }

    public var now: Date { lock.withLock { current } }

    public func advance(by seconds: TimeInterval) {
        lock.withLock { current += seconds }
    }

    /// Wakes when signalled, or to look at this clock again every few milliseconds (the test
    /// moves it from another thread).
    public func wait(_ condition: NSCondition, until deadline: Date) -> Bool {
        if now >= deadline { return false }
        _ = condition.wait(until: Date(timeIntervalSinceNow: 0.005))
        return now < deadline
    }
}
