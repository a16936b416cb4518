import Foundation

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
