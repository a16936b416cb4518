import Foundation

/// What time it is, for the parts that decide by it: when an upload is due (its delay, its
/// retries), when the uploader and the change feed run their next round, when a read of a
/// placeholder gives up or asks the store again, when a claim gives up, when the cache limit is
/// checked. The daemon uses the system's (`SystemTime`); a test moves a `ManualTime` itself, so
/// what waits for time waits for the test, not for a sleep.
///
/// The stores decide by one too (`DirectoryStore.time`, `S3Objects.time`: the journal's and
/// versions' stamps and pruning, the S3 log's and snapshots' intervals).
///
/// What goes by the system's steady clock instead (`Deadline`, `Stopwatch`): how long a caller
/// waits for work another thread does (`Uploader.hurryAndWait`, `Materializer.settle`, an
/// event queue's read), which is a guard against a hang rather than a decision, and a slow
/// link's pace (`ThrottledStore`). The pauses between retries (`RetryPolicy`) of S3 requests
/// sleep in real time.
public protocol TimeSource: Sendable {
    var now: Date { get }
    /// Waits on `condition` (locked by the caller, as `NSCondition.wait` wants) until it is
    /// signalled or `deadline` has passed by this clock. False when the deadline has passed.
    func wait(_ condition: NSCondition, until deadline: Date) -> Bool
    /// Runs `work` on `queue` once `seconds` have passed by this clock; `work.cancel()` calls
    /// it off.
    func after(_ seconds: TimeInterval, on queue: DispatchQueue, execute work: DispatchWorkItem)
}

extension TimeSource {
    /// Blocks the calling thread until `seconds` have passed by this clock.
    public func sleep(_ seconds: TimeInterval) {
        let nobody = NSCondition()
        let deadline = now + seconds
        nobody.lock()
        while wait(nobody, until: deadline) {}
        nobody.unlock()
    }
}

/// The system's clock.
public struct SystemTime: TimeSource {
    public init() {}
    public var now: Date { Date() }
    public func wait(_ condition: NSCondition, until deadline: Date) -> Bool { condition.wait(until: deadline) }
    public func after(_ seconds: TimeInterval, on queue: DispatchQueue, execute work: DispatchWorkItem) {
        queue.asyncAfter(deadline: .now() + seconds, execute: work)
    }
}

/// A clock that stands still until `advance` moves it.
public final class ManualTime: TimeSource, @unchecked Sendable {
    private let lock = NSLock()
    private var current: Date
    /// Work waiting for its time (`after`), with its queue.
    private var timers: [(due: Date, queue: DispatchQueue, work: DispatchWorkItem)] = []

    public init(_ start: Date = Date(timeIntervalSince1970: 1_800_000_000)) { current = start }

    public var now: Date { lock.withLock { current } }

    /// Moves the clock `seconds` on. Work that falls due on the way runs on its queue, in the
    /// order of its time (work it schedules runs too, if due by then), and has run when this
    /// returns: call it from no queue that such work runs on.
    public func advance(by seconds: TimeInterval) {
        let target = now + seconds
        while true {
            let next: (due: Date, queue: DispatchQueue, work: DispatchWorkItem)? = lock.withLock {
                guard let i = timers.indices.filter({ timers[$0].due <= target })
                        .min(by: { timers[$0].due < timers[$1].due }) else { return nil }
                let t = timers.remove(at: i)
                current = max(current, t.due)
                return t
            }
            guard let next else { break }
            if !next.work.isCancelled { next.queue.sync(execute: next.work) }
        }
        lock.withLock { current = max(current, target) }
    }

    /// Work waiting for this clock to reach its time.
    public var pendingTimers: Int { lock.withLock { timers.filter { !$0.work.isCancelled }.count } }

    /// Wakes when signalled, or to look at this clock again every few milliseconds (the test
    /// moves it from another thread).
    public func wait(_ condition: NSCondition, until deadline: Date) -> Bool {
        if now >= deadline { return false }
        _ = condition.wait(until: Date(timeIntervalSinceNow: 0.005))
        return now < deadline
    }

    public func after(_ seconds: TimeInterval, on queue: DispatchQueue, execute work: DispatchWorkItem) {
        lock.withLock { timers.append((current + seconds, queue, work)) }
    }
}

/// The system's steady clock, in nanoseconds since boot: what `Deadline` and `Stopwatch` go
/// by, and what notes when something last happened (a change, a read, a kernel notice).
public enum SteadyClock {
    @inlinable public static var nanoseconds: UInt64 { DispatchTime.now().uptimeNanoseconds }
}

/// A moment some seconds from now on the system's steady clock: how long a caller waits for
/// another thread's work (a guard against a hang, not a decision, which goes by a
/// `TimeSource`). A wall clock set back or forward meanwhile (NTP, a laptop that slept) does
/// not move it.
public struct Deadline: Sendable {
    private let end: UInt64

    public init(in seconds: TimeInterval) {
        let now = SteadyClock.nanoseconds
        // Forever only when asked for; a NaN (a bug upstream) waits for nothing.
        end = seconds == .infinity ? .max : seconds.isNaN ? now : now &+ UInt64(max(0, min(seconds, 1e9)) * 1e9)
    }

    public var passed: Bool { SteadyClock.nanoseconds >= end }

    /// Seconds left (0 once passed).
    public var remaining: TimeInterval {
        let now = SteadyClock.nanoseconds
        return now >= end ? 0 : Double(end - now) / 1e9
    }

    /// Waits on `condition` (locked by the caller) until it is signalled or this deadline
    /// passes. False when it has passed.
    @discardableResult
    public func wait(_ condition: NSCondition) -> Bool {
        let left = remaining
        guard left > 0 else { return false }
        return condition.wait(until: Date(timeIntervalSinceNow: min(left, 1e6)))
    }
}

/// Seconds since it was started, on the system's steady clock (a transfer's rate, how long a
/// command took).
public struct Stopwatch: Sendable {
    private let start = SteadyClock.nanoseconds
    public init() {}
    public var seconds: TimeInterval { Double(SteadyClock.nanoseconds - start) / 1e9 }
}
