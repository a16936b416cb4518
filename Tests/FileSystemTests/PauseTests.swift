import Foundation
import Testing
import TestSupport
import UbiqClock
@testable import UbiqFS
import UbiqStore
@testable import UbiqSync

/// Sync paused by the user (`ubiq pause`, `SyncPause`): nothing goes up and nothing comes in,
/// across a restart, until it is resumed or its time is over by the clock; what is opened is
/// still downloaded.
@Suite struct PauseTests {
    func inStore(_ store: DirectoryStore, _ key: String) -> Bool {
        (try? runBlocking { try await store.head(key) }) != nil
    }

    @Test func aPausedDeviceSendsAndTakesNothingUntilResumed() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.write("before", "here before the pause")
        a.sync()
        let b = try Device(store: store)
        try b.engine.pause.pause(for: nil)
        #expect(b.engine.pause.isPaused && b.engine.pause.attribute == "indefinitely")
        try b.write("from-b", "b")
        #expect(b.uploader.processRound(ignoringDelay: true) == 0)
        #expect(!inStore(store, "from-b"), "uploaded while paused")
        try a.write("from-a", "a")
        a.sync()
        b.pull()
        #expect(throws: FSError.notFound) { try b.ino("from-a") }
        // `ubiq sync` says so rather than wait.
        #expect(throws: FSError.self) { try b.fs.syncWithStore(everywhere: false) }
        // What is opened still downloads.
        #expect(try b.read("before") == "here before the pause")
        // A restart stays paused.
        try b.open()
        #expect(b.engine.pause.isPaused)
        #expect(b.uploader.processRound(ignoringDelay: true) == 0)
        b.pull()
        #expect(throws: FSError.notFound) { try b.ino("from-a") }
        try b.engine.pause.resume()
        b.sync()
        b.pull()
        #expect(inStore(store, "from-b"))
        #expect(try b.read("from-a") == "a")
        try b.open()
        #expect(!b.engine.pause.isPaused, "paused again after a restart")
    }

    /// A pause of a given length ends by the clock, without a resume.
    @Test func aPauseForAWhileEndsByTheClock() throws {
        let store = try newStore()
        let time = ManualTime()
        let d = try Device(store: store, time: time)
        try d.engine.pause.pause(for: 3600)
        #expect(d.engine.pause.attribute == ISO8601DateFormatter().string(from: time.now.addingTimeInterval(3600)))
        try d.write("f", "x")
        time.advance(by: 3599)
        #expect(d.uploader.processRound(ignoringDelay: true) == 0)
        #expect(!inStore(store, "f"))
        time.advance(by: 2)
        #expect(!d.engine.pause.isPaused && d.engine.pause.attribute == "")
        d.sync()
        #expect(inStore(store, "f"))
    }
}
