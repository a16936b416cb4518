import Foundation

/// What time it is, for the parts that decide by it: when an upload is due (its delay, its
/// retries), when the uploader pauses. The daemon uses the system's (`SystemTime`); a test
/// moves a `ManualTime` itself, so what waits for time waits for the test, not for a sleep.
/// (Threads that wait for one another still wait in real time.)
public protocol TimeSource: Sendable {
    var now: Date { get }
}

/// The system's clock.
public struct SystemTime: TimeSource {
    public init() {}
    public var now: Date { Date() }
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
}
