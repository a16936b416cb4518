import Foundation
import Synchronization
import Testing
import TestSupport
import UbiqClock
@testable import UbiqSync

/// What waits for the store's next changes (`PollWaits`): a waiter looks after each poll until
/// it is done, a last time when its deadline comes by the clock, never twice at once and
/// never after it is done; one poll lists everything once the waiter has waited long enough.
@Suite struct PollWaitsTests {
    @Test func aWaiterLooksAfterEachPollUntilItIsDone() {
        let time = ManualTime()
        let waits = PollWaits(time: time)
        let looks = Mutex<[Bool]>([])
        waits.add(until: time.now.addingTimeInterval(30), everywhereAt: time.now.addingTimeInterval(5)) { last in
            looks.withLock { $0.append(last); return $0.count == 3 }
        }
        #expect(!waits.isEmpty)
        #expect(!waits.lookAll(), "a listing of everything asked before the waiter waited 5 s")
        time.advance(by: 6)
        #expect(waits.lookAll(), "no listing of everything asked after 5 s")
        #expect(!waits.isEmpty)
        #expect(!waits.lookAll(), "a listing of everything asked twice")
        #expect(waits.isEmpty, "still waiting after it said it was done")
        #expect(!waits.lookAll())
        time.advance(by: 30)  // its deadline's look finds it gone
        #expect(looks.withLock { $0 } == [false, false, false])
    }

    @Test func theLastLookComesWhenTheClockSaysSo() {
        let time = ManualTime()
        let waits = PollWaits(time: time)
        let looks = Mutex<[Bool]>([])
        waits.add(until: time.now.addingTimeInterval(30), everywhereAt: time.now.addingTimeInterval(5)) { last in
            looks.withLock { $0.append(last) }
            return false
        }
        time.advance(by: 29)
        #expect(looks.withLock { $0 }.isEmpty, "a look with no poll before the deadline")
        time.advance(by: 1)
        #expect(looks.withLock { $0 } == [true], "no last look at the deadline")
        #expect(waits.isEmpty)
        _ = waits.lookAll()
        #expect(looks.withLock { $0 } == [true], "a look after the last")
    }

    /// Polls from many threads at once, and the deadline among them: each waiter's looks never
    /// overlap, and none comes after the one that ended it.
    @Test func looksNeverOverlapNorFollowTheEnd() async throws {
        let time = ManualTime()
        let waits = PollWaits(time: time)
        let inLook = Mutex<Set<Int>>([]), ended = Mutex<Set<Int>>([])
        let overlaps = Atomic<Int>(0), afterEnd = Atomic<Int>(0), looks = Atomic<Int>(0)
        for w in 0 ..< 20 {
            waits.add(until: time.now.addingTimeInterval(10), everywhereAt: time.now.addingTimeInterval(5)) { last in
                looks.add(1, ordering: .relaxed)
                if ended.withLock({ $0.contains(w) }) { afterEnd.add(1, ordering: .relaxed) }
                if !inLook.withLock({ $0.insert(w).inserted }) { overlaps.add(1, ordering: .relaxed) }
                usleep(50)
                _ = inLook.withLock { $0.remove(w) }
                if last { _ = ended.withLock { $0.insert(w) } }
                return last
            }
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0 ..< 4 {
                group.addTask { try await onAThreadOfItsOwn { for _ in 0 ..< 200 { _ = waits.lookAll() } } }
            }
            group.addTask { try await onAThreadOfItsOwn { time.advance(by: 10) } }
            try await group.waitForAll()
        }
        #expect(waits.isEmpty, "a waiter outlived its deadline")
        #expect(ended.withLock { $0.count } == 20, "a waiter had no last look")
        #expect(looks.load(ordering: .relaxed) > 20, "the polls looked at nothing")
        #expect(overlaps.load(ordering: .relaxed) == 0)
        #expect(afterEnd.load(ordering: .relaxed) == 0, "a look after the last")
    }
}
