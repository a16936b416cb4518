import Foundation

/// When something that failed is tried again, and when it stops: the one shape of every retry
/// (a store request, a chunk of a download, an upload, the change feed's next poll). The pause
/// after each failure doubles from `first` up to `most`, after `steady` failures that do not
/// grow it; `jitter` spreads each pause at random (0.5: from half to one and a half times it),
/// so that devices that failed together do not come back together; `tries` is how many tries
/// in all before giving up (nil: for as long as it takes).
///
/// The policies themselves live with what they retry (`S3Client.retries`, `SyncRetries`), so
/// that "how does an upload retry" has one answer in one place.
public struct RetryPolicy: Sendable, Equatable {
    public var first: TimeInterval
    public var most: TimeInterval
    public var steady: Int
    public var jitter: Double
    public var tries: Int?

    public init(first: TimeInterval, most: TimeInterval = .infinity, steady: Int = 0, jitter: Double = 0, tries: Int? = nil) {
        self.first = max(0, first)
        self.most = max(self.first, most)
        self.steady = max(0, steady)
        self.jitter = min(1, max(0, jitter))
        self.tries = tries.map { max(1, $0) }
    }

    /// The pause before the next try, after `failures` (1 or more) tries failed in a row.
    public func pause(afterFailures failures: Int) -> TimeInterval {
        let doublings = min(62, max(0, failures - 1 - steady))
        let pause = min(most, first * pow(2, Double(doublings)))
        return jitter > 0 ? pause * Double.random(in: (1 - jitter) ... (1 + jitter)) : pause
    }

    /// Whether another try follows `failures` failed ones.
    public func triesAgain(afterFailures failures: Int) -> Bool { tries.map { failures < $0 } ?? true }

    /// `body`, tried again while it throws what `again` calls worth another try and the policy
    /// allows, the calling thread blocked for each pause (by `time`).
    public func run<T>(again: (Error) -> Bool, time: any TimeSource = SystemTime(), _ body: () throws -> T) throws -> T {
        var failures = 0
        while true {
            do { return try body() } catch where again(error) {
                failures += 1
                guard triesAgain(afterFailures: failures) else { throw error }
                let pause = self.pause(afterFailures: failures)
                if pause > 0 { time.sleep(pause) }
            }
        }
    }
}
