import Foundation
import Testing
import UbiqClock
import UbiqStore
@testable import UbiqSync

/// Every retry has one shape (`RetryPolicy`): these hold each policy to the pauses it was
/// written down with, so that a change to one is a change someone meant.
@Suite struct RetryPolicyTests {
    static func pauses(_ p: RetryPolicy, _ failures: ClosedRange<Int>) -> [TimeInterval] {
        failures.map { p.pause(afterFailures: $0) }
    }

    @Test func aPauseDoublesFromTheFirstUpToTheMost() {
        let p = RetryPolicy(first: 0.5, most: 3)
        #expect(Self.pauses(p, 1 ... 5) == [0.5, 1, 2, 3, 3])
        #expect(p.pause(afterFailures: 10_000) == 3)  // no overflow however long it fails
        #expect(p.triesAgain(afterFailures: 1_000_000))
    }

    @Test func steadyFailuresDoNotGrowThePause() {
        #expect(Self.pauses(RetryPolicy(first: 1, steady: 2), 1 ... 5) == [1, 1, 1, 2, 4])
    }

    @Test func aJitteredPauseStaysInItsSpread() {
        let p = RetryPolicy(first: 1, jitter: 0.5)
        let drawn = (0 ..< 200).map { _ in p.pause(afterFailures: 3) }
        #expect(drawn.allSatisfy { (2 ... 6).contains($0) })
        #expect(Set(drawn).count > 1, "jitter drew one value")
    }

    @Test func runTriesAsOftenAsThePolicySaysAndOnlyForWhatIsWorthIt() throws {
        var calls = 0
        #expect(throws: StoreError.self) {
            try RetryPolicy(first: 0, tries: 3).run(again: { _ in true }) { () throws -> Int in
                calls += 1
                throw StoreError.unavailable("down")
            }
        }
        #expect(calls == 3)
        calls = 0
        #expect(throws: StoreError.self) {
            try retryingTransient(RetryPolicy(first: 0, tries: 5)) { () throws -> Int in
                calls += 1
                throw StoreError.notFound(key: "k")  // an answer: not tried again
            }
        }
        #expect(calls == 1)
        calls = 0
        let got = try retryingTransient(RetryPolicy(first: 0, tries: 5)) { () throws -> Int in
            calls += 1
            if calls < 4 { throw StoreError.unavailable("down") }
            return 7
        }
        #expect(got == 7 && calls == 4)
    }

    /// The sync engine's policies, as they were written before they were one type.
    @Test func theSyncEnginesPoliciesKeepTheirPauses() {
        // An upload: half a second doubling, a minute at most, for as long as it takes.
        #expect(Self.pauses(SyncRetries.upload, 1 ... 9) == [0.5, 1, 2, 4, 8, 16, 32, 60, 60])
        #expect(SyncRetries.upload.tries == nil)
        // Sent back by the store: ten tries half a second apart, then as a failure.
        #expect(Self.pauses(SyncRetries.sentBack, 1 ... 13) == Array(repeating: 0.5, count: 11) + [1, 2])
        // A download's chunk: 0.2 s doubling to 3.2 s.
        #expect(Self.pauses(SyncRetries.chunk(tries: 3), 1 ... 7) == [0.2, 0.4, 0.8, 1.6, 3.2, 3.2, 3.2])
        #expect(SyncRetries.chunk(tries: 3).tries == 3)
        // The feed's polls of a store that is down: the interval doubled, 32 of them or a minute at most.
        #expect(Self.pauses(SyncRetries.feed(interval: 1), 1 ... 7) == [2, 4, 8, 16, 32, 32, 32])
        #expect(Self.pauses(SyncRetries.feed(interval: 3), 1 ... 6) == [6, 12, 24, 48, 60, 60])
        #expect(Self.pauses(SyncRetries.storeCall, 1 ... 2) == [0.05, 0.1] && SyncRetries.storeCall.tries == 3)
    }
}

/// A wait's guard goes by the steady clock (`Deadline`), whatever the wall clock does.
@Suite struct DeadlineTests {
    @Test func aDeadlinePassesOnceItsTimeIsUp() {
        #expect(Deadline(in: 0).passed && Deadline(in: -5).passed && Deadline(in: 0).remaining == 0)
        let later = Deadline(in: 60)
        #expect(!later.passed && (59 ... 60).contains(later.remaining))
        #expect(!Deadline(in: .infinity).passed && Deadline(in: .nan).passed && Deadline(in: -.infinity).passed)
    }

    @Test func aWaitEndsAtItsDeadline() {
        let cond = NSCondition()
        cond.lock()
        #expect(!Deadline(in: 0).wait(cond))  // passed: no wait at all
        let soon = Deadline(in: 0.05)
        let watch = Stopwatch()
        while !soon.passed { soon.wait(cond) }
        cond.unlock()
        #expect(watch.seconds >= 0.05)
    }
}
