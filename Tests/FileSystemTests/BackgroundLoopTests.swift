import Foundation
import Synchronization
import Testing
import TestSupport
import UbiqClock
@testable import UbiqSync

/// The loop the Uploader and the ChangeFeed run on.
@Suite struct BackgroundLoopTests {
    /// A kick wakes a loop that waits with nothing to do (here, for up to a minute); a burst of
    /// kicks while it works is taken in a few rounds (each round waits `atLeast` after one),
    /// not one round a kick; stop waits for the round under way and ends the thread.
    @Test func kicksWakeAnIdleLoopAndABurstIsTakenInFewRounds() throws {
        let loop = BackgroundLoop()
        let rounds = Atomic<Int>(0)
        loop.start(name: "test-loop") {
            rounds.add(1, ordering: .relaxed)
            return BackgroundLoop.Pause(upTo: 60, atLeast: 0.05)
        }
        defer { loop.stop() }
        func waitFor(_ n: Int) -> Bool { waitUntil { rounds.load(ordering: .relaxed) >= n } }
        #expect(waitFor(1), "the first round never ran")
        #expect(waitUntil { loop.isIdle }, "the loop never waited after its first round")
        #expect(rounds.load(ordering: .relaxed) == 1, "a round ran without a kick, long before its wait was over")
        loop.cond.lock(); loop.kickLocked(wake: false); loop.cond.unlock()
        #expect(waitFor(2), "a kick did not wake the idle loop")

        // 100,000 kicks as fast as they come: a handful of rounds, not one each.
        let before = rounds.load(ordering: .relaxed)
        for _ in 0 ..< 100_000 { loop.cond.lock(); loop.kickLocked(wake: false); loop.cond.unlock() }
        #expect(waitUntil { rounds.load(ordering: .relaxed) > before && loop.isIdle }, "no round for the burst, or no rest after it")
        let burst = rounds.load(ordering: .relaxed) - before
        #expect(burst >= 1 && burst < 1000, "\(burst) rounds for a burst of kicks")

        // stop returns once the thread ended: nothing runs after it, kicked or not.
        loop.stop()
        #expect(!loop.isStopping, "stop returned before the loop's thread ended")
        let stopped = rounds.load(ordering: .relaxed)
        loop.cond.lock(); loop.kickLocked(wake: true); loop.cond.unlock()
        #expect(rounds.load(ordering: .relaxed) == stopped, "a round ran after stop returned")
    }

    /// A pause goes by the loop's clock: with a clock that stands still, the loop waits however
    /// long the test takes; once the clock has passed the pause, the next round runs unkicked.
    @Test func aPauseIsOverWhenTheClockSaysSo() throws {
        let time = ManualTime()
        let loop = BackgroundLoop(time: time)
        let rounds = Atomic<Int>(0)
        loop.start(name: "test-clock-loop") {
            rounds.add(1, ordering: .relaxed)
            return BackgroundLoop.Pause(upTo: 60)
        }
        defer { loop.stop() }
        #expect(waitUntil { loop.isIdle }, "the first round never ended")
        time.advance(by: 59)
        usleep(200_000)
        #expect(rounds.load(ordering: .relaxed) == 1, "the next round ran 59 s into a 60 s pause by the clock")
        time.advance(by: 2)
        #expect(waitUntil { rounds.load(ordering: .relaxed) == 2 }, "the pause did not end when the clock passed it")
    }
}
