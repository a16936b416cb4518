import Foundation
import UbiqClock
import CUbiq
import Synchronization
import UbiqCoordinator
import UbiqState
import UbiqStore
import UbiqSync

/// Where a read puts its bytes: memory the caller owns until the read's reply.
public struct ReadBuffer: @unchecked Sendable {
    public let pointer: UnsafeMutableRawPointer
    public init(_ pointer: UnsafeMutableRawPointer) { self.pointer = pointer }
}

/// Content: open, read, write, flush, fsync, release, setattr, fallocate.
extension FileSystem {
    /// Opens a file handle on a present regular file.
    func openHandle(_ n: Node, _ t: Inodes, flags: Int32) throws -> UInt64 {
        guard n.isRegular else { throw n.isDirectory ? FSError.isDirectory : FSError.invalid }
        let fd = cache.open(n.rec.ino, writable: (flags & O_ACCMODE) != O_RDONLY)
        if fd < 0 { throw FSError.fromErrno(errno) }
        return adoptHandle(n, t, fd: fd, flags: flags)
    }

    /// Registers a handle over an already open cache file descriptor.
    func adoptHandle(_ n: Node, _ t: Inodes, fd: Int32, flags: Int32) -> UInt64 {
        let handle = Handle(ino: n.rec.ino, fd: fd, flags: flags)
        t.touch(n)
        let fh = t.add(handle)
        n.opens += 1
        if handle.canWrite { n.writers += 1 }
        // An open that was under way when the last name went: its close may write the rows
        // again, so they are dropped at `forget` after all.
        n.rowsDeleted = false
        return fh
    }

    /// What an open file handle refers to (takes the inode table's lock).
    /// `appends`: opened with O_APPEND.
    private func handle(_ fh: UInt64) throws -> (ino: UInt64, fd: Int32, canWrite: Bool, appends: Bool) {
        try inodes.locked { t in
            guard let h = t.handle(fh) else { throw FSError.badHandle }
            return (h.ino, h.fd, h.canWrite, h.flags & O_APPEND != 0)
        }
    }

    /// A download finished: the file is local from now on (called by the Materializer).
    public func contentArrived(_ ino: UInt64, version: String) {
        inodes.locked { t in
            guard let n = t[ino], !n.rec.present else { return }
            // Only if the item still stands for the version downloaded: a remote update may have
            // made it the placeholder of a newer one meanwhile (its cache file removed).
            let current = try? state.read { tx in try tx.entries(of: ino).first { $0.remoteKey != nil }?.remoteVersion }
            // A file whose last name went while it was open (a rename over it, a delete) stands
            // for nothing, and is no one's but its readers': they read the version they opened,
            // as on a local disk, until the last close takes it. Its rows are gone: memory only.
            if n.nlink == 0 && n.isRegular && current == nil {
                n.rec.present = true
                return
            }
            guard current == version else {
                logger.info("download of inode \(ino) finished for version \(version), but it stands for \(current.flatMap { $0 } ?? "none") now: not kept")
                return
            }
            n.rec.present = true
            let rec = n.rec
            do { try persist { tx in tx.upsert(rec) } } catch {
                logger.error("could not record the download of inode \(ino): \(error)")
            }
        }
        // Its blocks changed (`du` counts what is local): the kernel caches attributes for long.
        invalidateKernelAttributes(ino)
        cacheLimit.scheduleCheck()
        emit(.status, ino)
    }

    /// The version a placeholder stands for is gone from the store (replaced in a store that
    /// keeps no prior versions): look at the store now, so the next open reads the new one.
    private func versionGone(_ error: Error) {
        if case StoreError.notFound = error { storeFeed?.kick(everywhere: true) }
    }

    /// A download found the version it reads gone from the store (`materialize`).
    struct VersionGone: Error { let error: Error }

    /// Brings a placeholder's content into the cache (call holding an exclusive claim, without
    /// the inode table's lock). `goneThrown`: a version gone from the store is thrown as
    /// `VersionGone`, for the caller to wait for the move that took it (`waitForAMove`).
    private func materialize(_ ino: UInt64, goneThrown: Bool = false) throws {
        let needed = try inodes.locked { t -> Bool in
            let n = try t.node(ino)
            return n.isRegular && !n.rec.present
        }
        guard needed else { return }
        do { try materializer.fetch(ino) } catch {
            if goneThrown, case StoreError.notFound = error { throw VersionGone(error: error) }
            logger.error("download of inode \(ino) failed: \(error)")
            versionGone(error)
            throw Self.downloadError(error)
        }
        try inodes.locked { t in
            let n = try t.node(ino)
            n.rec.present = true
            let rec = n.rec
            try persist { tx in tx.upsert(rec) }
        }
        invalidateKernelAttributes(ino)
    }

    /// Downloads a placeholder whole, to write it (under a download claim). Its version gone
    /// from the store (moved elsewhere, the move not yet seen here), it waits for the move
    /// without the claim (`waitForAMove`); false: the move came, and the caller starts over.
    private func downloadWhole(_ ino: UInt64) throws -> Bool {
        let source = try state.read { tx in try tx.entries(of: ino).first { $0.remoteKey != nil } }
        do {
            let c = try claim([ino], .download)
            defer { coordinator.release(c) }
            try materialize(ino, goneThrown: true)
            return true
        } catch let gone as VersionGone {
            guard let key = source?.remoteKey, let version = source?.remoteVersion else { throw Self.downloadError(gone.error) }
            let done = DispatchSemaphore(value: 0)
            let why = Mutex<String?>(nil)
            waitForAMove(ino, from: (key, version), until: state.time.now.addingTimeInterval(movedVersionWait)) { w in
                why.withLock { $0 = w }
                done.signal()
            }
            done.wait()
            guard let why = why.withLock({ $0 }) else { return false }
            logger.error("download of inode \(ino) failed: \(gone.error) (\(why))")
            throw FSError.io("download failed: \(gone.error) (\(why))")
        }
    }

    /// `downloadWhole` until it is done, starting over after each move it waited for, at most
    /// `tries` times (then ETIMEDOUT).
    private func downloadWhole(_ ino: UInt64, tries: Int) throws {
        for _ in 0 ..< tries {
            if try downloadWhole(ino) { return }
        }
        throw FSError.timedOut
    }

    /// What a failed download is to the caller: ENOSPC for a full local disk, else EIO.
    static func downloadError(_ error: Error) -> FSError {
        if case SyncError.noSpace = error { return .noSpace }
        return .io("download failed: \(error)")
    }

    /// Whether `open` (with `flags`) or a `setattr` to `size` of `ino` waits for the store:
    /// a placeholder opened for writing, or cut to a length other than 0, is downloaded whole
    /// first. The FUSE binding answers such requests from another thread.
    public func waitsForStore(_ ino: UInt64, flags: Int32? = nil, size: Int64? = nil) -> Bool {
        inodes.locked { t in
            guard let n = t[ino], n.isRegular, !n.rec.present else { return false }
            if let flags { return (flags & O_ACCMODE) != O_RDONLY && (flags & O_TRUNC) == 0 }
            if let size { return size != 0 }
            return false
        }
    }

    /// What an open of `ino` is answered (`KernelSizeAtOpen`). The kernel keeps the size it last
    /// learned of a file until it asks again, and it does not ask before an open, an O_APPEND
    /// write (it writes at that size) or a read within it (a read that comes back shorter is
    /// filled with zeros, which stay in its cache while a write is on its way). After another
    /// device's version replaced the content (`Inodes.replacedContent`), or an append came at
    /// another end than this device's (`write`), that size may be wrong until the kernel has
    /// looked the name up again and kept the answer (`kernelLookedUp`):
    /// - `.lookAgain` (ESTALE): the kernel looks the name up again (its one retry, with
    ///   LOOKUP_REVAL) and learns the size before it opens. Every open is so answered until an
    ///   answer to a lookup was kept, not once per version: an open that came while the first
    ///   one's kernel looked again opened with the old size (two appenders at once: one append
    ///   came at the old end, and the kernel then held a size past the true end; a reader read
    ///   zeros there). Not twice within a second (`sizeUnsureFor`), so that the retry cannot meet it.
    /// - `.unsure`: within that second after such an answer, while no answer to a lookup was
    ///   kept, the open goes on with the kernel's page cache off for the handle
    ///   (FOPEN_DIRECT_IO), whatever the kernel believes: the kernel's retry (its lookup's
    ///   answer may have met a notice or a write), or another process's open that came while
    ///   the first one's kernel looked again. Its reads are what the file holds; its appends go
    ///   at this device's end (`write`).
    /// - `.known`: as usual.
    ///
    /// Also `.lookAgain`: a file not here whose last name went (written over by a rename,
    /// removed, moved by another device) while the kernel still held the name: its version is
    /// no longer one the store keeps for it, so it cannot be read, where a local disk would have
    /// opened the old file. The kernel looks the name up again and opens what stands there now,
    /// or says ENOENT: as if the open had come just after the change.
    ///
    /// The kernel's retry of an open answered so is never answered ESTALE (`mayAnswerStale`):
    /// `.unsure` for a size, `.gone` (ENOENT) for a file that went: the file the name stood
    /// for went while the open looked again, as if it had come just after that.
    public func kernelSizeAtOpen(_ ino: UInt64, pid: Int32? = nil) -> KernelSizeAtOpen {
        inodes.locked { t in
            guard let n = t[ino] else { return .known }
            let gone = n.nlink == 0 && n.isRegular && !n.rec.present && materializer.localBytes(ino) == nil
            let now = SteadyClock.nanoseconds
            if !gone {
                guard n.kernelSizeStale else { return .known }
                if n.lookAgainAsked > 0 && Double(now - n.lookAgainAsked) < sizeUnsureFor * 1e9 { return .unsure }
            }
            guard mayAnswerStale(pid: pid) else { return gone ? .gone : .unsure }
            if !gone { n.lookAgainAsked = now }
            return .lookAgain
        }
    }

    /// Whether an open by thread `pid` may be answered ESTALE, and notes that it was
    /// (`StaleOpens`): not the kernel's retry of one so answered.
    public func mayAnswerStale(pid: Int32?) -> Bool { staleOpens.mayAnswer(pid: pid) }

    /// An open by thread `pid` was answered (a handle, or an error other than ESTALE): the
    /// retry of one sent back came, if it was waited for (`mayAnswerStale`).
    public func openAnswered(pid: Int32) { staleOpens.answered(pid: pid) }

    /// The kernel took an answer to a lookup of `ino` (sent: the FUSE binding calls this after
    /// the reply), with its size. It kept that size if nothing bumped the inode's attribute
    /// version while the lookup was out: no notice for it was sent since the open was sent
    /// back to look again, and no handle of it is open (a write's end bumps it, and so does a
    /// read that came back short). Then the size it holds is right again (`kernelSizeAtOpen`).
    /// Every entry the kernel takes comes here (a lookup, a create, a mkdir): while no node's
    /// size is stale, it takes no lock (`Node.staleSizes`).
    public func kernelLookedUp(_ ino: UInt64) {
        guard Node.staleSizes.load(ordering: .relaxed) > 0 else { return }
        inodes.locked { t in
            guard let n = t[ino], n.kernelSizeStale, n.opens == 0, n.lookAgainAsked > 0,
                  SteadyClock.nanoseconds - n.lookAgainAsked < 5_000_000_000,
                  noticeTimes.quiet(ino, since: n.lookAgainAsked) else { return }
            n.kernelSizeStale = false
        }
    }

    /// `clearSetID`: an O_TRUNC open whose caller may not keep setuid/setgid.
    public func open(_ ino: UInt64, flags: Int32, caller: Caller = .root, clearSetID: SetIDClearing? = nil) throws -> UInt64 {
        // A remote version may replace the content while this open prepares: then it starts over.
        for _ in 0 ..< 8 {
            if let fh = try openOnce(ino, flags: flags, caller: caller, clearSetID: clearSetID) { return fh }
        }
        throw FSError.timedOut
    }

    private func openOnce(_ ino: UInt64, flags: Int32, caller: Caller, clearSetID: SetIDClearing?) throws -> UInt64? {
        let writable = (flags & O_ACCMODE) != O_RDONLY
        let truncate = writable && (flags & O_TRUNC) != 0
        let (isDir, present, epoch) = try inodes.locked { t -> (Bool, Bool, Int) in
            let n = try t.node(ino)
            return (n.isDirectory, n.rec.present, n.contentEpoch)
        }
        if isDir { throw FSError.isDirectory }
        do {
            if truncate {
                _ = try setattr(ino, AttributeChanges(size: 0, clearSetID: clearSetID), caller: .root)
            } else if !present && writable {
                // Writing needs the whole file (for now): download it first.
                try downloadWhole(ino, tries: 8)
            } else if !present && !hydration.mayDownload(pid: caller.pid) {
                // A thumbnailer or indexer: no download for it. (What is local already is served.)
                if materializer.localBytes(ino) == nil {
                    logger.info("not downloading inode \(ino) for a program that may not (pid \(caller.pid))")
                    throw FSError.accessDenied
                }
            } else if !present {
                // Reading streams: start the download (or join it); reads wait for their own range.
                do { try materializer.start(ino, background: false) } catch {
                    if try changedWhileOpening(ino, epoch: epoch) { return nil }
                    logger.error("download of inode \(ino) could not start: \(error)")
                    throw FSError.io("download failed: \(error)")
                }
            }
        } catch let error as FSError where error != .stale {
            if try changedWhileOpening(ino, epoch: epoch) { return nil }
            throw error
        }
        return try inodes.locked { t -> UInt64? in
            let n = try t.node(ino)
            if n.contentEpoch != epoch { return nil }
            return try openHandle(n, t, flags: flags & ~O_TRUNC)
        }
    }

    /// Whether what an open prepared for went while it did: another version came in (true: the
    /// open starts over), or the file, not here, lost its last name (a rename over it, another
    /// device's change; FSError.stale: the kernel looks the name up again and opens what stands
    /// there now, as `kernelSizeAtOpen` has it when that was so before the open). Its
    /// download could not start, or failed: the version it was for is not one the store keeps
    /// for it any more. False: the failure is the open's.
    private func changedWhileOpening(_ ino: UInt64, epoch: Int) throws -> Bool {
        let now = inodes.locked { t in t[ino].map { ($0.contentEpoch, $0.nlink == 0 && !$0.rec.present) } }
        guard let (nowEpoch, gone) = now else { throw FSError.stale }
        if nowEpoch != epoch { return true }
        if gone && materializer.localBytes(ino) == nil { throw FSError.stale }
        return false
    }

    /// Reads up to `count` bytes at `offset` into `buffer`; returns how many (0 at end of file).
    public func read(_ fh: UInt64, offset: Int64, count: Int, into buffer: UnsafeMutableRawPointer) throws -> Int {
        try waitForAnswer { answer in read(fh, offset: offset, count: count, into: ReadBuffer(buffer), reply: answer) }
    }

    /// Reads up to `count` bytes at `offset` into `buffer` and calls `reply` with how many (0 at
    /// end of file): on the calling thread when the bytes are here, and otherwise later, on
    /// another thread, once they arrived from the store. A FUSE worker thread is thus never held
    /// by a read that waits for the store; `buffer` must stay valid until `reply` runs.
    public func read(_ fh: UInt64, offset: Int64, count: Int, into buffer: ReadBuffer,
                     reply: @escaping @Sendable (Result<Int, Error>) -> Void) {
        read(fh, offset: offset, count: count, into: buffer, waitingForAMoveUntil: nil, reply: reply)
    }

    /// `waitingForAMoveUntil`: a read asked again after the version it read was gone
    /// (`waitForAMove`), and until when (by the state's clock) it may still wait for that.
    private func read(_ fh: UInt64, offset: Int64, count: Int, into buffer: ReadBuffer, waitingForAMoveUntil: Date?,
                      reply: @escaping @Sendable (Result<Int, Error>) -> Void) {
        noteRead()  // uploads wait a little for reads to settle too: they share the disk
        let ino: UInt64, fd: Int32, c: Claim
        do {
            (ino, fd, _, _) = try handle(fh)
            c = try claim([ino], .read)
        } catch { reply(.failure(error)); return }
        let local = inodes.locked { t in t[ino]?.rec.present ?? true }
        // What the download reads from (set at open): a read that finds it gone waits for it to change.
        let source = local ? nil : materializer.source(ino)
        let finish: @Sendable (Error?) -> Void = { [self] failure in
            // The download ended between this read's look and its wait (its job gone): what it
            // brought is read.
            let downloadFailure = failure != nil && inodes.locked({ t in t[ino]?.rec.present ?? false }) ? nil : failure
            if let e = downloadFailure, case StoreError.notFound = e, let source {
                let deadline = waitingForAMoveUntil ?? state.time.now.addingTimeInterval(movedVersionWait)
                if state.time.now < deadline {
                    // Without its claim meanwhile: the move's arrival claims the item.
                    coordinator.release(c)
                    waitForAMove(ino, from: source, until: deadline) { [self] why in
                        guard let why else {
                            read(fh, offset: offset, count: count, into: buffer, waitingForAMoveUntil: deadline, reply: reply)
                            return
                        }
                        logger.error("read of inode \(ino) at \(offset) failed: \(e) (\(why))")
                        reply(.failure(FSError.io("download failed: \(e) (\(why))")))
                    }
                    return
                }
            }
            let r: Result<Int, Error>
            if let e = downloadFailure {
                logger.error("read of inode \(ino) at \(offset) failed: \(e)")
                versionGone(e)
                r = .failure(Self.downloadError(e))
            } else {
                r = Result { try Self.readAll(fd, offset: offset, count: count, into: buffer.pointer) }
                if case .success = r { touchAccessTime(ino) }
            }
            coordinator.release(c)
            reply(r)
        }
        if local {
            finish(nil)
        } else {
            materializer.whenLocal(ino, range: offset ..< offset + Int64(count), finish)
        }
    }

    /// A read found the version it reads (`source`) gone from the store. On S3 a move on another
    /// device deletes the old keys just before the log object that tells of it (docs/s3.md), so
    /// the move comes with one of the next polls: the change feed polls now and every quarter
    /// second (`ChangeFeed.afterEachPoll`), and after each this looks until the item stands for
    /// another key or version (`then(nil)`: the read is asked again, its download goes on from
    /// there, `Materializer.follow`), or says why it will not (`then(why)`): the item is gone,
    /// its new version waits for its readers to close (another device wrote over it: the
    /// version read is gone for good), or no move came by `deadline` (by the state's clock).
    /// `then` runs on a thread of its own, never the feed's.
    private func waitForAMove(_ ino: UInt64, from source: (key: String, version: String), until deadline: Date,
                              _ then: @escaping @Sendable (String?) -> Void) {
        let answer: @Sendable (String?) -> Void = { why in DispatchQueue.global().async { then(why) } }
        guard let feed = storeFeed else { answer("no change feed to bring the move"); return }
        feed.afterEachPoll(for: deadline.timeIntervalSince(state.time.now), everywhereAfter: 5) { [self] last in
            let now = try? state.read { tx in try tx.entries(of: ino).first { $0.remoteKey != nil } }
            guard let entry = now.flatMap({ $0 }), let key = entry.remoteKey else { answer("gone from the store"); return true }
            if key != source.key || entry.remoteVersion != source.version { answer(nil); return true }
            if waitingForClose.withLock({ $0.contains(ino) }) { answer("written over in the store while open here"); return true }
            if last { answer("no move of it came in \(Int(movedVersionWait)) s"); return true }
            return false
        }
    }

    private static func readAll(_ fd: Int32, offset: Int64, count: Int, into buffer: UnsafeMutableRawPointer) throws -> Int {
        var done = 0
        while done < count {
            let n = pread(fd, buffer + done, count - done, off_t(offset) + off_t(done))
            if n < 0 {
                if errno == EINTR { continue }
                throw FSError.fromErrno(errno)
            }
            if n == 0 { break }
            done += n
        }
        return done
    }

    /// A read moves the access time as the mount's mode says (`AccessTimes`: relatime, as
    /// ext4 mounts by default, unless asked otherwise). Like ext4, the update stays in memory
    /// and is written with the inode's next change, or in one batch at unmount
    /// (`writeAccessTimes`): an access time lost to a crash loses no data.
    private func touchAccessTime(_ ino: UInt64) {
        guard accessTimes != .never else { return }
        inodes.locked { t in
            guard let n = t[ino], n.nlink > 0 else { return }
            let now = nowNanos()
            let r = n.rec
            guard accessTimes.moves(atime: r.atimeNs, mtime: r.mtimeNs, ctime: r.ctimeNs, now: now) else { return }
            n.rec.atimeNs = now
            n.atimeDirty = true
        }
    }

    /// Writes access times kept in memory (at unmount).
    public func writeAccessTimes() {
        inodes.locked { t in
            let dirty = t.residents.filter { $0.atimeDirty && !$0.rowsDeleted }
            guard !dirty.isEmpty else { return }
            do {
                try persist { tx in for n in dirty { tx.upsert(n.rec) } }
                for n in dirty { n.atimeDirty = false }
            } catch {
                logger.warning("could not write access times: \(error)")
            }
        }
    }

    /// The first write since a file's content was last made durable: its new generation is
    /// committed (and its upload queued) before any byte reaches the cache file. After a crash
    /// the state then says the cache file holds a write (uploaded as it is), and a cache file
    /// that differs from a version marked as uploaded is damage, not a write (FileSystem.load).
    /// Not synced: it only has to come before the bytes, which a killed daemon keeps in order.
    private func markBeingWritten(_ ino: UInt64) throws {
        try inodes.locked { t in
            guard let n = t[ino], !n.unpersisted else { return }
            n.rec.contentGen += 1
            let rec = n.rec, named = n.nlink > 0, delay = uploadDelay
            try persist { tx in
                tx.upsert(rec)
                if named { tx.enqueue(ino, delay: delay) }
            }
            n.unpersisted = true
        }
    }

    /// Writes `count` bytes from `data` at `offset`; returns how many were written.
    /// `clearSetID`: the writer may not keep setuid/setgid (`Node.clearSetID`).
    ///
    /// A handle opened with O_APPEND writes at the end of the file as this device has it, not
    /// at `offset`: the kernel's offset is the size it last learned, and a version from another
    /// device may have replaced the content since (its invalidation drops the size the kernel
    /// keeps, but an append does not ask again). Written at the kernel's offset, the append went
    /// over the other device's lines, or left a hole of zeros after a shorter version. The
    /// kernel's pages then hold the bytes where it thought they went: they are dropped.
    /// (The writeback cache, where the kernel appends itself, is never asked for.)
    public func write(_ fh: UInt64, offset: Int64, count: Int, from data: UnsafeRawPointer,
                      clearSetID: SetIDClearing? = nil) throws -> Int {
        let (ino, fd, canWrite, appends) = try handle(fh)
        guard canWrite else { throw FSError.badHandle }
        if offset < 0 { throw FSError.invalid }
        let c = try claim([ino], .write)
        defer { coordinator.release(c) }
        try markBeingWritten(ino)
        var offset = offset
        // Read under the claim: no other write moves the end meanwhile.
        let end = appends ? inodes.locked { t in t[ino]?.rec.size } : nil
        let relocated = end.map { $0 != offset } ?? false
        if relocated, let end { logger.notice("an append to inode \(ino) came at \(offset), the end is \(end): written there") }
        if let end { offset = end }
        if relocated {
            // The kernel now holds a size other than the file's: it looks again (`kernelSizeAtOpen`).
            inodes.locked { t in t[ino]?.kernelSizeStale = true }
        }
        var freedForThis = false
        if !state.reserve.contentHasRoom(for: Int64(count)) {
            // The disk filled up and the state database took its reserve: content may not use
            // that space (an rm, a close must still commit). Make room from evictable files once.
            freedForThis = true
            if cacheLimit.enforce(target: max(0, localContentBytes - Int64(count) - (64 << 20)), waiting: false) > 0 { state.reserve.restore() }
            if !state.reserve.contentHasRoom(for: Int64(count)) { throw FSError.noSpace }
        }
        var done = 0
        while done < count {
            let n = pwrite(fd, data + done, count - done, off_t(offset) + off_t(done))
            if n < 0 {
                if errno == EINTR { continue }
                // The cache's disk is full: make room from evictable files once, then retry.
                if (errno == ENOSPC || errno == EDQUOT) && !freedForThis {
                    freedForThis = true
                    if cacheLimit.enforce(target: max(0, localContentBytes - Int64(count - done) - (64 << 20)), waiting: false) > 0 { continue }
                }
                if done > 0 { break }
                throw FSError.fromErrno(errno)
            }
            done += n
        }
        let (modeChanged, hasCapabilities) = inodes.locked { t -> (Bool, Bool) in
            guard let n = t[ino] else { return (false, false) }
            let now = nowNanos()
            n.rec.size = max(n.rec.size, offset + Int64(done))
            n.rec.mtimeNs = now
            n.rec.ctimeNs = now
            n.rec.contentGen += 1
            n.unpersisted = true
            return (clearSetID.map { n.clearSetID(inGroup: $0.inGroup) } ?? false, n.xattrs[Self.fileCapabilities] != nil)
        }
        if hasCapabilities { try dropFileCapabilities(ino) }
        if relocated { invalidateKernelCache(ino) }
        Self.startWriteback(fd, from: offset, to: offset + Int64(done))
        // The kernel keeps the mode it had (a write refreshes only size and times).
        if modeChanged { invalidateKernelAttributes(ino) }
        return done
    }

    /// A write takes a file's capabilities (`security.capability`) away, whoever writes, as
    /// on a local disk. The kernel does it itself before a write through its page cache; not
    /// before one that skips it (a new write-only file's: `FuseOps.create`), and with
    /// FUSE_HANDLE_KILLPRIV_V2 it is the file system's to do. (`write` asks only when the file
    /// has them: no second trip through the inode table's lock for every write.)
    private func dropFileCapabilities(_ ino: UInt64) throws {
        try inodes.locked { t in
            guard let n = t[ino], n.xattrs[Self.fileCapabilities] != nil else { return }
            n.rec.ctimeNs = nowNanos()
            n.rec.metaGen += 1
            let rec = n.rec, named = n.nlink > 0, delay = uploadDelay
            try persist { tx in
                tx.removeXattr(ino, name: Self.fileCapabilities)
                tx.upsert(rec)
                if named { tx.enqueue(ino, delay: delay) }
            }
            n.xattrs[Self.fileCapabilities] = nil
        }
    }

    static let fileCapabilities = Array("security.capability".utf8)

    /// A write that passes the end of an aligned 8 MiB of the cache file starts the disk
    /// writing those 8 MiB (`sync_file_range`, no wait). A large file written in order then
    /// goes to the disk while the writer goes on, and the `fsync` (or writeback) after it finds
    /// most of it written: without it the writes filled the page cache first and the disk
    /// began at the `fsync`, one after the other (1 GiB + fsync: `scripts/bench`). Small files
    /// never pass one, and nothing is promised by it: durability is still `fsync`'s.
    static let writebackWindow: Int64 = 8 << 20

    static func startWriteback(_ fd: Int32, from offset: Int64, to end: Int64) {
        let w = writebackWindow
        guard end / w > offset / w else { return }
        _ = cubiq_start_writeback(fd, (end / w - 1) * w, w)
    }

    /// close(2): commits what was written (the new size and times, the upload queued). A
    /// killed daemon loses nothing of it: the cache file's bytes and the committed WAL frames
    /// are in the kernel's page cache. With `syncOnClose`, also durable as fsync makes it.
    public func flush(_ fh: UInt64) throws {
        let (ino, fd, _, _) = try handle(fh)
        try commitWrites(ino, fd: fd, sync: syncOnClose)
    }

    /// fsync(2), fdatasync(2): commits what was written, and makes the cache file and the
    /// database durable against power loss before it returns (whatever was committed
    /// before, by a close on another handle, too).
    public func fsync(_ fh: UInt64, dataOnly: Bool) throws {
        let (ino, fd, _, _) = try handle(fh)
        try commitWrites(ino, fd: fd, sync: true, evenIfCommitted: true)
    }

    /// Commits what was written through any handle of `ino`; `sync`: and makes it durable
    /// (`evenIfCommitted`: also when a close committed it before, without a sync).
    private func commitWrites(_ ino: UInt64, fd: Int32, sync: Bool, evenIfCommitted: Bool = false) throws {
        if inodes.locked({ t in t[ino]?.unpersisted ?? false }) {
            // Exclusive, so no write lands between the sync and the commit of the size it produced.
            let c = try claim([ino], .write)
            defer { coordinator.release(c) }
            try commitSize(ino)
            measureAllocation(ino, fd: fd)
            if sync { try syncContent(ino, fd: fd) }
            kickUploader()
        } else if evenIfCommitted {
            try syncContent(ino, fd: fd)
        }
    }

    /// Notes the blocks `ino`'s cache file (`fd`) holds for its content now (`Node.allocated`),
    /// under its write claim: `st_blocks` then leaves holes out, as on a local disk.
    private func measureAllocation(_ ino: UInt64, fd: Int32) {
        var st = stat()
        guard fd >= 0, fstat(fd, &st) == 0 else { return }
        inodes.locked { t in
            guard let n = t[ino], n.rec.present else { return }
            n.allocated = (n.rec.contentGen, Int64(st.st_blocks))
        }
    }

    /// lseek(2)'s SEEK_DATA and SEEK_HOLE (the kernel answers the other kinds itself): where
    /// the next data or hole is, from `offset`. A file here in full answers from its cache file,
    /// holes and all, as the disk does; a placeholder, or a file part downloaded, is all data:
    /// its bytes are the store's, and a hole there would tell `cp` and `tar` to skip bytes they
    /// must read. ENXIO past the end.
    public func seek(_ fh: UInt64, offset: Int64, whence: Int32) throws -> Int64 {
        let (ino, fd, _, _) = try handle(fh)
        guard whence == CUBIQ_SEEK_DATA || whence == CUBIQ_SEEK_HOLE else { throw FSError.invalid }
        let c = try claim([ino], .read)
        defer { coordinator.release(c) }
        let (present, size) = try inodes.locked { t in let n = try t.node(ino); return (n.rec.present, n.rec.size) }
        if offset < 0 || offset >= size { throw FSError.system(ENXIO) }
        guard present else { return whence == CUBIQ_SEEK_DATA ? offset : size }
        let at = lseek(fd, off_t(offset), whence)
        if at < 0 { throw FSError.fromErrno(errno) }
        // The cache file's end is the file's: a hole found past it (none should be) is the end.
        return min(Int64(at), size)
    }

    /// Commits the new size and times of `ino` and queues its upload (under its write claim).
    private func commitSize(_ ino: UInt64) throws {
        guard inodes.locked({ t in t[ino]?.unpersisted ?? false }) else { return }
        let delay = uploadDelay
        try inodes.locked { t in
            guard let n = t[ino] else { return }
            let rec = n.rec
            let named = n.nlink > 0
            try persist { tx in
                tx.upsert(rec)
                if named { tx.enqueue(ino, delay: delay) }
            }
            n.unpersisted = false
        }
    }

    /// Syncs the cache file and the database concurrently: ext4 can serve both with one
    /// journal commit. Both are on disk before it returns. (If only the commit survived a
    /// power loss, recovery takes the size from the cache file.)
    private func syncContent(_ ino: UInt64, fd: Int32) throws {
        let walSynced = DispatchSemaphore(value: 0)
        let state = self.state
        DispatchQueue.global().async { state.syncToDisk(); walSynced.signal() }
        let failed = fd >= 0 && fdatasync(fd) != 0 ? errno : 0
        walSynced.wait()
        if failed != 0 { throw FSError.fromErrno(failed) }
    }

    public func release(_ fh: UInt64) {
        guard let h = inodes.locked({ t in t.removeHandle(fh) }) else { return }
        if h.canWrite { try? commitWrites(h.ino, fd: h.fd, sync: syncOnClose) }
        close(h.fd)
        let (lastClose, closed) = inodes.locked { t -> (Bool, Bool) in
            guard let n = t[h.ino] else { return (false, false) }
            n.opens -= 1
            if h.canWrite { n.writers -= 1 }
            reapIfUnreferenced(n, t)
            return (n.opens == 0 && !n.rec.present, n.opens == 0)
        }
        // Opened and never read: no download keeps waiting for it.
        if lastClose { materializer.cancelIfIdle(h.ino) }
        if h.canWrite { emit(.changed, h.ino) }
        // An update from the store waited for this close.
        if closed, waitingForClose.withLock({ $0.remove(h.ino) != nil }) { storeFeed?.kick(everywhere: false) }
        // Only writing can have grown the cache here (downloads check when they finish): a
        // close after reading does not ask for the check.
        if h.canWrite { cacheLimit.scheduleCheck() }
    }

    /// chmod, chown, utimens, truncate. `fh` is the handle of ftruncate/futimens, if any.
    public func setattr(_ ino: UInt64, _ ch: AttributeChanges, fh: UInt64? = nil, caller: Caller) throws -> Attributes {
        if let size = ch.size, waitsForStore(ino, size: size) {
            // A placeholder cut to another length than 0 is downloaded whole first, before the
            // write claim (a download whose version is gone waits for a move without it).
            try downloadWhole(ino, tries: 8)
        }
        let c = try claim([ino], .write)
        defer { coordinator.release(c) }
        if let size = ch.size {
            if size < 0 { throw FSError.invalid }
            let (isDir, isReg, present) = try inodes.locked { t -> (Bool, Bool, Bool) in
                let n = try t.node(ino)
                return (n.isDirectory, n.isRegular, n.rec.present)
            }
            if isDir { throw FSError.isDirectory }
            if !isReg { throw FSError.invalid }
            if !present {
                if size == 0 {
                    // (Present from here: marked so below, with the new size.)
                    do { try cache.createEmpty(ino) } catch { throw FSError.fromErrno(errno) }
                } else {
                    try materialize(ino)
                }
            }
            if cache.truncate(ino, to: size) != 0 { throw FSError.fromErrno(errno) }
        }
        let delay = uploadDelay
        var accessChanged = false
        let a = try inodes.locked { t -> Attributes in
            let n = try t.node(ino)
            let now = nowNanos()
            if n.isDirectory {
                accessChanged = ch.mode.map { $0 & 0o7777 != n.rec.perm } == true || ch.uid.map { $0 != n.rec.uid } == true
                    || ch.gid.map { $0 != n.rec.gid } == true
            }
            if let size = ch.size {
                n.rec.present = true  // held in full now (downloaded or emptied above, under the claim)
                n.rec.size = size
                n.rec.mtimeNs = now
                n.rec.contentGen += 1
                // `truncate -s 1G` makes a file of one hole: its blocks are the cache file's.
                var st = stat()
                n.allocated = stat(cache.path(ino), &st) == 0 ? (n.rec.contentGen, Int64(st.st_blocks)) : nil
            }
            if let mode = ch.mode { n.rec.perm = mode & 0o7777 }
            if let clear = ch.clearSetID { _ = n.clearSetID(inGroup: clear.inGroup) }
            if let uid = ch.uid { n.rec.uid = uid }
            if let gid = ch.gid { n.rec.gid = gid }
            switch ch.atime { case .now: n.rec.atimeNs = now; case .at(let t): n.rec.atimeNs = t; case nil: break }
            switch ch.mtime { case .now: n.rec.mtimeNs = now; case .at(let t): n.rec.mtimeNs = t; case nil: break }
            n.rec.ctimeNs = now
            n.rec.metaGen += 1
            // Mode, owner and times of a file whose writes a close has yet to commit go with
            // that commit (tar x and cp -p set them on the file they are writing, just before
            // its close: three transactions a file fewer). A killed daemon loses them only
            // with the writes, which no close had returned for.
            if ch.size == nil && n.unpersisted && n.writers > 0 { return attributes(n) }
            let rec = n.rec
            let named = n.nlink > 0 || ino == rootIno
            try persist { tx in
                tx.upsert(rec)
                if named && ino != rootIno { tx.enqueue(ino, delay: delay) }
            }
            if ch.size != nil { n.unpersisted = false }
            return attributes(n)
        }
        if accessChanged { folderAccessChanged(ino) }
        kickUploader()
        emit(.changed, ino)
        return a
    }

    /// fallocate(2): every mode the disk under the cache supports (allocate,
    /// KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE, COLLAPSE_RANGE, INSERT_RANGE); the
    /// new size is read back from the cache file, so each mode's effect on
    /// the size is the disk's own. One that fails leaves the disk as it found it
    /// (`AllocationUndo`).
    /// `clearSetID`: the caller may not keep setuid/setgid (the kernel does not say so for a
    /// fallocate when the file system handles it: the binding passes "not root").
    public func fallocate(_ fh: UInt64, mode: Int32, offset: Int64, length: Int64, clearSetID: SetIDClearing? = nil) throws {
        if offset < 0 || length <= 0 { throw FSError.invalid }
        let (ino, fd, canWrite, _) = try handle(fh)
        guard canWrite else { throw FSError.badHandle }
        let c = try claim([ino], .write)
        defer { coordinator.release(c) }
        let undo = AllocationUndo(fd: fd, mode: mode, offset: offset, length: length)
        let failure = cubiq_fallocate(fd, mode, offset, length) == 0 ? nil
            : { (e: Int32) in e == EOPNOTSUPP ? FSError.notSupported : FSError.fromErrno(e) }(cubiq_errno())
        if let failure {
            // A disk that failed it may keep what it took (ext4 does): given back.
            undo?.giveBack()
            // A mode that changes bytes in place may have changed some before it failed (ext4's
            // ZERO_RANGE zeroes the range first): what the cache file holds is the content now,
            // recorded as a change below, and the kernel's pages of it go.
            let inPlace = FALLOC_FL_ZERO_RANGE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE
            if mode & Int32(inPlace) == 0 { throw failure }
            invalidateKernelCache(ino)
        }
        var st = stat()
        if fstat(fd, &st) != 0 { throw FSError.fromErrno(errno) }
        let modeChanged = inodes.locked { t -> Bool in
            guard let n = t[ino] else { return false }
            let now = nowNanos()
            n.rec.size = Int64(st.st_size)
            n.allocated = (n.rec.contentGen + 1, Int64(st.st_blocks))
            n.rec.mtimeNs = now
            n.rec.ctimeNs = now
            n.rec.contentGen += 1
            n.unpersisted = true
            return clearSetID.map { n.clearSetID(inGroup: $0.inGroup) } ?? false
        }
        if modeChanged { invalidateKernelAttributes(ino) }
        if let failure { throw failure }
    }

    // MARK: - Extended attributes

    static func checkXattrName(_ name: [UInt8]) throws {
        if name.isEmpty || name.count > 255 { throw FSError.range }
        if !isKept(name) { throw FSError.notSupported }
    }

    /// Whether items here can have an extended attribute of this name: `user.*`, `trusted.*` and
    /// `security.*`, but not POSIX ACLs (`system.*`: none is kept, so the kernel enforces none)
    /// nor security labels (`security.selinux`, `security.SMACK64…`: a label is the host's
    /// policy, which a FUSE mount's files take from it, not from the file). Those answer
    /// EOPNOTSUPP to a read too, as ext4 mounted `noacl` does for an ACL: `ls -l` and `cp` then
    /// ask once a mount, not twice a file.
    static func isKept(_ name: [UInt8]) -> Bool {
        func has(_ prefix: String) -> Bool { name.starts(with: prefix.utf8) }
        return has("user.") || has("trusted.") || (has("security.") && !has("security.selinux") && !has("security.SMACK64"))
    }

    public func getxattr(_ ino: UInt64, _ name: [UInt8]) throws -> [UInt8] {
        if name.starts(with: Self.reservedPrefix) {
            if let v = try controlAttribute(ino, name) { return v }
            throw FSError.noAttribute
        }
        if !Self.isKept(name) { throw FSError.notSupported }
        return try inodes.locked { t in
            let n = try t.node(ino)
            guard let v = n.xattrs[name] else { throw FSError.noAttribute }
            return v
        }
    }

    /// The item's own attributes. The `user.ubiq.*` status attributes are answered by name
    /// only, never listed (as CephFS does with `ceph.*`): status is not the file's data, so
    /// `cp -a`, `rsync -X` and `tar --xattrs` copy exactly what a local disk would.
    public func listxattr(_ ino: UInt64) throws -> [[UInt8]] {
        try inodes.locked { t in try t.node(ino).xattrs.keys.filter(Self.isKept).sorted { $0.lexicographicallyPrecedes($1) } }
    }

    public func setxattr(_ ino: UInt64, _ name: [UInt8], _ value: [UInt8], mode: XattrSetMode) throws {
        try Self.checkXattrName(name)
        if value.count > XattrLimits.valueBytes { throw FSError.range }
        if name.starts(with: Self.reservedPrefix) { return try setControlAttribute(ino, name, value) }
        let c = try claim([ino], .write)
        defer { coordinator.release(c) }
        try inodes.locked { t in
            let n = try t.node(ino)
            if name.starts(with: Array("user.".utf8)) && !(n.isRegular || n.isDirectory) { throw FSError.notPermitted }
            let exists = n.xattrs[name] != nil
            if mode == .create && exists { throw FSError.exists }
            if mode == .replace && !exists { throw FSError.noAttribute }
            // No more than a disk holds for one item (XattrLimits): ENOSPC, as ext4 says.
            let others = n.xattrs.reduce(0) { $0 + ($1.key == name ? 0 : $1.key.count + $1.value.count) }
            if others + name.count + value.count > XattrLimits.totalBytes { throw FSError.noSpace }
            n.rec.ctimeNs = nowNanos()
            n.rec.metaGen += 1
            let rec = n.rec
            try persist { tx in
                tx.setXattr(ino, name: name, value: value)
                tx.upsert(rec)
                if ino != rootIno { tx.enqueue(ino) }
            }
            n.xattrs[name] = value
        }
        kickUploader()
        emit(.changed, ino)
    }

    public func removexattr(_ ino: UInt64, _ name: [UInt8]) throws {
        try Self.checkXattrName(name)
        let c = try claim([ino], .write)
        defer { coordinator.release(c) }
        try inodes.locked { t in
            let n = try t.node(ino)
            guard n.xattrs[name] != nil else { throw FSError.noAttribute }
            n.rec.ctimeNs = nowNanos()
            n.rec.metaGen += 1
            let rec = n.rec
            try persist { tx in
                tx.removeXattr(ino, name: name)
                tx.upsert(rec)
                if ino != rootIno { tx.enqueue(ino) }
            }
            n.xattrs[name] = nil
        }
        kickUploader()
        emit(.changed, ino)
    }
}
