import Foundation
import UbiqClock

/// Notices for the kernel (a name or an inode it should forget), sent in the order they were
/// posted by a thread of their own, started when some wait and ended when none do. Never by
/// Dispatch's shared threads: a notice can wait long in the kernel (a name's waits for its
/// folder's lock, which the kernel holds while a request on that folder waits for the daemon's
/// answer, such as a `setfattr` of `user.ubiq.action` that waits for a poll of the store), and
/// the shared threads also run the store's work (`runBlocking`). Notices waiting so took those
/// threads one by one, and the poll the request waited for stalled with them: 20,000 new items
/// from another device held a `ubiq sync` 7 s with nothing running.
///
/// Names and inodes go through two of these (`FileSystem`): a name's notice waits for a
/// folder's lock, an inode's for its pages, and neither should wait behind the other.
final class KernelNotices<Notice>: @unchecked Sendable {
    private let lock = NSLock()
    private var waiting: [Notice] = []
    private var sending = false
    private let name: String
    private let send: (Notice) -> Void

    init(name: String, send: @escaping (Notice) -> Void) {
        self.name = name
        self.send = send
    }

    /// Sends `notice` after those posted before it; returns at once.
    func post(_ notice: Notice) {
        lock.lock()
        waiting.append(notice)
        let start = !sending
        sending = true
        lock.unlock()
        if start {
            let t = Thread { [self] in drain() }
            t.name = name
            t.start()
        }
    }

    private func drain() {
        while true {
            lock.lock()
            if waiting.isEmpty {
                sending = false
                lock.unlock()
                return
            }
            let batch = waiting
            waiting = []
            lock.unlock()
            for n in batch { send(n) }
        }
    }
}

/// When the inode notices for each inode were posted and sent (the steady clock's
/// nanoseconds), so that the file system can tell whether the kernel took an answer while a
/// notice could have met it: the kernel drops the attributes of an answer when a notice for
/// the same inode (which bumps its attribute version) lands while the request is out
/// (`FileSystem.kernelLookedUp`).
final class InodeNoticeTimes: @unchecked Sendable {
    private let lock = NSLock()
    /// Notices posted and not sent yet, by inode.
    private var waiting: [UInt64: Int] = [:]
    /// When each inode's last notice was sent; entries older than `kept` go when many are held.
    private var sent: [UInt64: UInt64] = [:]
    private let kept: UInt64 = 10_000_000_000

    func posted(_ ino: UInt64) { lock.withLock { waiting[ino, default: 0] += 1 } }

    func sent(_ ino: UInt64) {
        let now = SteadyClock.nanoseconds
        lock.withLock {
            if let w = waiting[ino] { waiting[ino] = w > 1 ? w - 1 : nil }
            sent[ino] = now
            if sent.count > 4096 { sent = sent.filter { now - $0.value < kept } }
        }
    }

    /// Whether no notice for `ino` waits, and none was sent after `since` (at most `kept` ago).
    func quiet(_ ino: UInt64, since: UInt64) -> Bool {
        lock.withLock { waiting[ino] == nil && (sent[ino] ?? 0) < since }
    }
}
