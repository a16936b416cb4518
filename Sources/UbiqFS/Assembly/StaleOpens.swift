import Foundation
import Synchronization
import UbiqClock

/// The threads whose open was last answered ESTALE, and when. The kernel tries an open so
/// answered once more, with LOOKUP_REVAL, and fails it with ESTALE at a second such answer,
/// which no program expects of a local disk; the retry can meet one when the name it looked
/// up again stands for another file by then, one that also went, or whose size the kernel
/// holds wrong (a rename over the name, another device's change, while it looked again).
/// So a thread's next open within `retryWindow` is taken for that retry and never sent back
/// (`FileSystem.kernelSizeAtOpen`); the note goes once that open was answered.
final class StaleOpens: Sendable {
    /// How long after an ESTALE answer a thread's next open is taken for the kernel's retry,
    /// in seconds; also how long the opens of that file skip the kernel's page cache by
    /// default (`FileSystem.sizeUnsureFor`).
    static let retryWindow: TimeInterval = 1
    private static let window = UInt64(retryWindow * 1e9)
    private let answered = Mutex<[Int32: UInt64]>([:])
    /// How many threads `answered` holds: while none is, an answered open takes no lock.
    private let held = Atomic<Int>(0)

    /// Whether an open by thread `pid` may be answered ESTALE, and notes that it was: not
    /// within `retryWindow` after the last such answer to it. nil: an open not from the
    /// kernel (tests), always.
    func mayAnswer(pid: Int32?) -> Bool {
        guard let pid else { return true }
        let now = SteadyClock.nanoseconds
        return answered.withLock { m in
            if let last = m[pid], now - last < Self.window { return false }
            if m.count > 256 { m = m.filter { now - $0.value < Self.window } }
            m[pid] = now
            held.store(m.count, ordering: .relaxed)
            return true
        }
    }

    /// An open by thread `pid` was answered (a handle, or an error other than ESTALE): the
    /// retry of one sent back came, if it was waited for.
    func answered(pid: Int32) {
        guard held.load(ordering: .relaxed) > 0 else { return }
        answered.withLock { m in
            m[pid] = nil
            held.store(m.count, ordering: .relaxed)
        }
    }
}
