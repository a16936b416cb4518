import Foundation
import UbiqClock
import UbiqCoordinator
import UbiqState
import UbiqStore
import UbiqSync

/// Steering sync from the mount: download, evict, pin — through the
/// `user.ubiq.action` and `user.ubiq.pinned` attributes (so plain `setfattr`
/// works) and the `ubiq` commands built on them.
extension FileSystem {
    static let actionAttribute = Array("user.ubiq.action".utf8)
    static let pinnedAttribute = Array("user.ubiq.pinned".utf8)
    static let reservedPrefix = Array("user.ubiq.".utf8)

    /// Handles a write to a `user.ubiq.*` attribute.
    func setControlAttribute(_ ino: UInt64, _ name: [UInt8], _ value: [UInt8]) throws {
        let v = String(decoding: value, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        switch name {
        case Self.actionAttribute:
            switch v {
            case "download": try download(ino)
            case "evict": try evict(ino)
            case "sync": try syncWithStore(everywhere: false)
            case "sync-full": try syncWithStore(everywhere: true)
            case "pin": try setPinned(ino, true)
            case "unpin": try setPinned(ino, false)
            default: throw FSError.invalid
            }
        case Self.pinnedAttribute:
            guard v == "1" || v == "0" else { throw FSError.invalid }
            try setPinned(ino, v == "1")
        default:
            throw FSError.notPermitted  // status attributes are read-only; unknown names are not stored
        }
    }

    /// Reads a `user.ubiq.*` attribute; nil when it is not one ubiq answers.
    func controlAttribute(_ ino: UInt64, _ name: [UInt8]) throws -> [UInt8]? {
        switch name {
        case Self.pinnedAttribute: return Array((try isPinned(ino) ? "1" : "0").utf8)
        default: return try statusAttribute(ino, String(decoding: name.dropFirst(Self.reservedPrefix.count), as: UTF8.self))
        }
    }

    /// `ubiq sync`: sends what is queued (waiting while that makes progress, at most
    /// `syncWait`, a minute: `ubiq sync` asks again while fewer items wait each time; not
    /// `flushing`: only starts it), then looks for other devices' changes; `everywhere` (`ubiq
    /// sync --full`): also for what changed in the store without its feed knowing (another
    /// tool's objects in a bucket, found by listing it whole).
    /// A look that fails for a moment (the store unavailable: a timeout, a 503) is tried again
    /// twice, 0.2 s and 0.4 s later, before it says the store could not be reached (each of a
    /// look's requests is retried a little already; this rides out a store down a little longer).
    /// A store the last poll could not reach (or none has yet) is asked first, with one request
    /// (`StoreFeed.storeAnswers`): still unreachable, the sync says so at once, in a second or
    /// two, rather than wait out the uploads' minute (`ubiq sync` with the server down said
    /// nothing until its caller gave up; a poll of a store that is down takes 15 s and more).
    public func syncWithStore(everywhere: Bool, flushing: Bool = true) throws {
        if let pause = uploader?.pause, pause.isPaused {
            throw FSError.io("sync is paused \(pause.said) (ubiq resume goes on)")
        }
        func look(everywhere: Bool) throws {
            guard let feed = storeFeed else { return }
            do {
                try retryingTransient(SyncRetries.syncAsked) { _ = try feed.poll(everywhere: everywhere) }
            } catch {
                logger.warning("sync with the store failed: \(error)")
                throw FSError.io("the store could not be reached: \(error)")
            }
        }
        if flushing, let feed = storeFeed, case let seen = feed.look, seen.error != nil || seen.reached == nil, !feed.storeAnswers() {
            logger.warning("sync with the store failed: it does not answer")
            throw FSError.io("the store could not be reached (it does not answer)")
        }
        if flushing { uploader?.flush(timeout: syncWait) }
        defer { if !flushing { uploader?.kick() } }
        try look(everywhere: everywhere)
    }

    /// Starts downloading a placeholder, or every placeholder under a folder. Returns at once.
    public func download(_ ino: UInt64) throws {
        let one = try inodes.locked { t -> [UInt64]? in
            let n = try t.node(ino)
            return n.isDirectory ? nil : n.isRegular && !n.rec.present ? [ino] : []
        }
        // A folder's files not in memory are judged by their rows, read first (not one by one
        // under the lock). Not for one file: `ubiq download` asks file by file, and reading
        // every file's row for each made a folder of 10,000 take 10,000 times 10,000 rows.
        let stored = one == nil ? try storedFiles(present: false) : []
        let files = try one ?? inodes.locked { t -> [UInt64] in
            _ = try t.node(ino)
            return t.subtree(ino).filter { i in t.resident(i).map { $0.isRegular && !$0.rec.present } ?? stored.contains(i) }
        }
        for f in files {
            do { try materializer.start(f) } catch {
                logger.error("download of inode \(f) could not start: \(error)")
                throw FSError.io("download failed: \(error)")
            }
        }
    }

    /// Turns a downloaded file back into a placeholder and frees its space; on a folder,
    /// every file under it (the ones that cannot be evicted are left, and the first
    /// refusal is the answer). Refuses, losing nothing: an open file (EBUSY), a file
    /// whose changes are not all in the store (EINPROGRESS), a pinned one (EPERM).
    public func evict(_ ino: UInt64) throws {
        let isDir = try inodes.locked { t in try t.node(ino).isDirectory }
        if !isDir { return try evictFile(ino, waiting: true) }
        let stored = try storedFiles(present: nil)
        let files = inodes.locked { t in t.subtree(ino).filter { t.resident($0).map(\.isRegular) ?? stored.contains($0) } }
        var refusal: Error?
        for f in files {
            do { try evictFile(f, waiting: true) } catch { refusal = refusal ?? error }
        }
        if let refusal { throw refusal }
    }

    /// The regular files whose rows say they are held here in full (`present`), are
    /// placeholders, or (nil) either: for a walk of a folder that reads no file's node.
    private func storedFiles(present: Bool?) throws -> Set<UInt64> {
        do { return Set(try state.read { tx in try tx.regularFiles(present: present) }) } catch {
            throw FSError.io("state database: \(error)")
        }
    }

    /// `waiting` false: for a caller that holds a claim of its own (a write making room), so
    /// it must not wait for another (claims are taken in ascending order, all at once): a file
    /// claimed by anybody else, or open, is refused at once.
    func evictFile(_ ino: UInt64, waiting: Bool) throws {
        // close(2) returns before the kernel's RELEASE reaches us: a file closed a moment
        // ago still counts as open. Give pending releases a moment (before claiming: a
        // writer's release takes a claim of its own).
        let deadline = Deadline(in: waiting ? 1 : 0)
        while inodes.locked({ t in t.isOpen(ino) }) && !deadline.passed { usleep(5_000) }
        let c = try claim([ino], .evict, timeout: waiting ? nil : 0)
        defer { coordinator.release(c) }
        materializer.cancelIfIdle(ino)
        let downloading = materializer.settle(ino)
        let already = try inodes.locked { t -> Bool in
            let n = try t.node(ino)
            guard n.isRegular else { throw FSError.invalid }
            if !n.rec.present && !downloading { return true }
            if n.opens > 0 { throw FSError.busy }
            if n.unpersisted { throw FSError.notUploaded }
            return false
        }
        if already { return }
        if try isPinned(ino) { throw FSError.notPermitted }
        if downloading { throw FSError.busy }
        let uploaded: Bool
        do { uploaded = try state.read { try $0.isUploaded(ino) } } catch { throw FSError.io("state database: \(error)") }
        guard uploaded else { throw FSError.notUploaded }
        try inodes.locked { t in
            let n = try t.node(ino)
            n.rec.present = false
            n.allocated = nil
            let rec = n.rec
            try persist { tx in
                tx.upsert(rec)
                tx.removeDownload(ino)
            }
        }
        cache.remove(ino)
        invalidateKernelCache(ino)
        logger.info("evicted inode \(ino)")
    }

    public func setPinned(_ ino: UInt64, _ pinned: Bool) throws {
        let c = try claim([ino], .write)
        try {
            defer { coordinator.release(c) }
            try inodes.locked { t in
                let n = try t.node(ino)
                guard n.rec.pinned != pinned else { return }
                n.rec.pinned = pinned
                let rec = n.rec
                try persist { tx in tx.upsert(rec) }
            }
        }()
        // Unpinned, it may be evicted now: the cache limit holds again.
        if pinned { try download(ino) } else { cacheLimit.scheduleCheck() }
    }

    /// Pinned itself, or under a pinned folder.
    public func isPinned(_ ino: UInt64) throws -> Bool {
        let (own, isDir, dirParent) = try inodes.locked { t -> (Bool, Bool, UInt64) in
            let n = try t.node(ino)
            return (n.rec.pinned, n.isDirectory, n.parent)
        }
        if own { return true }
        // Folders know their parent; a file's parents are the folders of its names.
        var starts: [UInt64]
        if isDir {
            starts = ino == rootIno ? [] : [dirParent]
        } else {
            do { starts = try state.read { try $0.entries(of: ino).map(\.parent) } } catch { starts = [] }
        }
        return inodes.locked { t in
            for start in starts {
                var p = start
                var depth = 0
                while let n = t[p], depth < 4096 {
                    if n.rec.pinned { return true }
                    if p == rootIno { break }
                    p = n.parent
                    depth += 1
                }
            }
            return false
        }
    }

    /// At start: placeholders under pinned items begin downloading.
    func resumePinnedDownloads() {
        let pinned = (try? state.read { tx in try tx.pinnedInodes() }) ?? []
        for p in pinned { try? download(p) }
    }
}
