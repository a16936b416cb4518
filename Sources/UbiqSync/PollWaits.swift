import Foundation
import Synchronization
import UbiqClock

/// What waits for the store's next changes: a read whose version is gone from the store waits
/// so for the move that took it (on S3 a move's old keys are deleted just before the log
/// object that tells of it, so the move comes with one of the next polls). Each waiter looks
/// after every poll, reached or not, until it says it is done, and a last time at its deadline
/// by the clock. While any waits, the feed polls every `pace` seconds (`ChangeFeed.round`), and
/// once a waiter has waited `everywhereAt`, one poll also lists everything (another tool wrote
/// over the file, or deleted it: no log tells of that).
final class PollWaits: Sendable {
    private struct Waiter: Sendable {
        let until: Date
        let everywhereAt: Date
        var everywhereAsked = false
        let look: @Sendable (_ last: Bool) -> Bool
    }

    /// Seconds between polls while something waits.
    static let pace: TimeInterval = 0.25

    private let waiting = Mutex<[Int: Waiter]>([:])
    private let count = Atomic<Int>(0)
    let time: any TimeSource

    init(time: any TimeSource) { self.time = time }

    var isEmpty: Bool { waiting.withLock { $0.isEmpty } }

    /// Adds a waiter until `until`; `look(last)` says whether it is done (`last`: its deadline
    /// has come, it is done whatever it says). Its last look is scheduled on the clock.
    func add(until: Date, everywhereAt: Date, _ look: @escaping @Sendable (_ last: Bool) -> Bool) {
        let id = count.add(1, ordering: .relaxed).newValue
        waiting.withLock { $0[id] = Waiter(until: until, everywhereAt: everywhereAt, look: look) }
        time.after(max(0, until.timeIntervalSince(time.now)), on: .global(), execute: DispatchWorkItem { [weak self] in
            self?.look(id)
        })
    }

    /// Every waiter looks (after a poll); returns whether one asks that the next poll list
    /// everything.
    func lookAll() -> Bool {
        let ids = waiting.withLock { Array($0.keys) }
        return ids.reduce(false) { everywhere, id in look(id) || everywhere }
    }

    /// Waiter `id` looks, taken out while it does (a poll and its deadline never let one look
    /// twice at once, nor after it is done); returns whether it asks for a listing of everything.
    private func look(_ id: Int) -> Bool {
        guard var w = waiting.withLock({ $0.removeValue(forKey: id) }) else { return false }
        let now = time.now
        let last = now >= w.until
        if w.look(last) || last { return false }
        let everywhere = !w.everywhereAsked && now >= w.everywhereAt
        if everywhere { w.everywhereAsked = true }
        waiting.withLock { $0[id] = w }
        return everywhere
    }
}
