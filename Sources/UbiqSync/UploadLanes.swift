import Foundation
import Synchronization
import UbiqState
import UbiqStore

// Items of one round sent side by side: a store answers each request after a round trip (tens
// of milliseconds on a real S3), so one item at a time leaves the link idle. Only items whose
// keys are apart go together; everything else keeps the outbox's order.
extension Uploader {
    /// The keys an upload of `s` may write or delete (each name's key and the key it had in
    /// the store); nil for a folder, whose marker and moves go alone.
    static func keys(of s: Snapshot) -> Set<KeyBytes>? {
        guard s.rec.type != UInt32(S_IFDIR) else { return nil }
        var keys: Set<KeyBytes> = []
        for (entry, path) in s.entries {
            if let path { keys.insert(KeyBytes(path)) }
            if let old = entry.remoteKey { keys.insert(KeyBytes(old)) }
        }
        return keys
    }

    /// How a round's items go: one `alone` after another, or `together` (side by side).
    enum Stage: Equatable { case alone(Int), together([Int]) }

    /// The stages of items with these keys (nil: a folder, or an item gone), oldest first.
    /// Folders go alone, in their place in the order. Between two folders, items go together
    /// unless one's keys meet an earlier one's (a file moved to where another was: `mv b c;
    /// mv a b`): those go alone, in order, after the others. An item that goes together meets
    /// no earlier item, so going before one that waits changes nothing it depends on.
    static func stages(_ keys: [Set<KeyBytes>?]) -> [Stage] {
        var stages: [Stage] = []
        var i = 0
        while i < keys.count {
            guard keys[i] != nil else {
                stages.append(.alone(i))
                i += 1
                continue
            }
            var apart: [Int] = [], after: [Int] = []
            var seen: Set<KeyBytes> = []
            while i < keys.count, let k = keys[i] {
                if k.isDisjoint(with: seen) { apart.append(i) } else { after.append(i) }
                seen.formUnion(k)
                i += 1
            }
            stages.append(.together(apart))
            stages += after.map(Stage.alone)
        }
        return stages
    }

    /// Uploads `due` (oldest first), up to `transfers` at once, in `stages`, and records each
    /// outcome; returns how many were handled. Stops at the first outcome that cannot be
    /// recorded.
    func uploadSideBySide(_ due: [StateTransaction.OutboxItem]) -> Int {
        if transfers <= 1 || due.count <= 1 {
            var handled = 0
            for item in due {
                guard uploadAndRecord(item, keys: nil) else { break }
                handled += 1
            }
            return handled
        }
        let keys = due.map { item in (try? snapshot(item.ino)).flatMap { $0.flatMap(Self.keys(of:)) } }
        var handled = 0
        for stage in Self.stages(keys) {
            switch stage {
            case .alone(let i):
                guard uploadAndRecord(due[i], keys: nil) else { return handled }
                handled += 1
            case .together(let items):
                let (n, stopped) = inLanes(items.map { (due[$0], keys[$0]) })
                handled += n
                if stopped { return handled }
            }
        }
        return handled
    }

    /// `items` on up to `transfers` threads (this one among them); how many were handled, and
    /// whether one could not be recorded (the others in flight finish; none starts after).
    private func inLanes(_ items: [(StateTransaction.OutboxItem, Set<KeyBytes>?)]) -> (Int, Bool) {
        struct Progress { var next = 0, handled = 0, stopped = false }
        let progress = Mutex(Progress())
        let work: @Sendable () -> Void = { [self] in
            while true {
                let at: Int? = progress.withLock { p in
                    guard !p.stopped, p.next < items.count else { return nil }
                    p.next += 1
                    return p.next - 1
                }
                guard let at else { return }
                let ok = uploadAndRecord(items[at].0, keys: items[at].1)
                progress.withLock { p in if ok { p.handled += 1 } else { p.stopped = true } }
            }
        }
        let helpers = (0 ..< min(transfers, items.count) - 1).map { n in
            let done = DispatchSemaphore(value: 0)
            let t = Thread { work(); done.signal() }
            t.name = "ubiq-upload-\(n + 2)"
            t.start()
            return done
        }
        work()
        for done in helpers { done.wait() }
        return progress.withLock { ($0.handled, $0.stopped) }
    }
}
