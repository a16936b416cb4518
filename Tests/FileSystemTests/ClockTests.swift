import Foundation
import Testing
import TestSupport
@testable import UbiqFS
import UbiqClock
import UbiqState
import UbiqStore
@testable import UbiqSync

/// Upload delays and retries go by the state's clock (`LocalState.time`): with a `ManualTime`
/// the test decides when time passes, and nothing here sleeps.
@Suite struct ClockTests {
    static func inStore(_ store: DirectoryStore, _ key: String) async -> Bool {
        (try? await store.head(key)) != nil
    }

    @Test func anUploadWaitsOutItsDelayByTheClock() async throws {
        let store = try DirectoryStore(root: TempPaths.make("ubiq-clock-store"))
        let time = ManualTime()
        let a = try Device(store: store, time: time, uploadDelay: 2)
        try a.write("plan.txt", "due in two seconds")
        a.uploader.processRound(ignoringDelay: false)
        #expect(await !Self.inStore(store, "plan.txt"), "not before its delay")
        time.advance(by: 1.9)
        a.uploader.processRound(ignoringDelay: false)
        #expect(await !Self.inStore(store, "plan.txt"), "1.9 s of 2")
        time.advance(by: 0.2)
        a.uploader.processRound(ignoringDelay: false)
        #expect(await Self.inStore(store, "plan.txt"), "due once the clock passed its delay")
        // A later change counts its delay from when it was made, by the same clock.
        try a.write("plan.txt", "changed")
        time.advance(by: 1)
        a.uploader.processRound(ignoringDelay: false)
        #expect(try await store.head("plan.txt").size == 18)
        time.advance(by: 1)
        a.uploader.processRound(ignoringDelay: false)
        #expect(try await store.head("plan.txt").size == 7)
    }

    @Test func aFailedUploadIsTriedAgainWhenItsWaitIsOver() async throws {
        let store = try DirectoryStore(root: TempPaths.make("ubiq-clock-store"))
        let faulty = FaultyStore(store)
        let time = ManualTime()
        let a = try Device(store: store, remote: faulty, time: time)
        faulty.fail(.put)
        try a.write("notes.txt", "retried")
        a.uploader.processRound(ignoringDelay: false)
        #expect(await !Self.inStore(store, "notes.txt"))
        faulty.heal()
        // The store is back at once, but the item waits out its retry (half a second, then more).
        a.uploader.processRound(ignoringDelay: false)
        #expect(await !Self.inStore(store, "notes.txt"), "tried again before its wait was over")
        time.advance(by: 0.6)
        a.uploader.processRound(ignoringDelay: false)
        #expect(await Self.inStore(store, "notes.txt"))
    }

    /// The change feed looks at the store again when its interval (3 s) has passed by the
    /// clock, not before.
    @Test func theFeedLooksAgainWhenItsIntervalHasPassedByTheClock() throws {
        let store = try DirectoryStore(root: TempPaths.make("ubiq-clock-store"))
        let time = ManualTime()
        let a = try Device(store: store)
        let b = try Device(store: store, time: time)
        b.feed.start()
        defer { b.feed.stop() }
        #expect(waitUntil { b.feed.isIdle }, "the first poll never ended")
        #expect(b.feed.look.polled == time.now, "the poll's time is the clock's")
        try a.write("news.txt", "from a")
        a.sync()
        time.advance(by: 2.9)
        usleep(300_000)
        #expect((try? b.ino("news.txt")) == nil, "polled 2.9 s into a 3 s interval by the clock")
        time.advance(by: 0.2)
        #expect(waitUntil { (try? b.ino("news.txt")) != nil }, "no poll once the interval had passed by the clock")
        #expect(try b.read("news.txt") == "from a")
    }
}
