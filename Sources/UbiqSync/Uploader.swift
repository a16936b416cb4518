import Foundation
import Synchronization
import Logging
import UbiqCoordinator
import UbiqState
import UbiqStore

/// Pushes local changes from the crash-safe outbox to the store.
///
/// The outbox holds one row per inode (repeated saves coalesce) plus
/// tombstones for objects to delete. For an inode the uploader compares what
/// the device has (names, content generation, metadata generation) with what
/// the store has (each name's remote key and version) and does what closes
/// the gap: put new content, server-side copy for a move or a metadata
/// change, delete the old key. Every write is conditional on the version the
/// edit started from; losing that race is a conflict, recorded, never an
/// overwrite. Content is snapshotted under an `upload` claim, so no write
/// lands half-way into what is sent.
public final class Uploader: @unchecked Sendable {
    let state: LocalState
    let store: any CloudStore
    let coordinator: Coordinator
    let cache: ContentCache
    let deviceID: String
    /// This device's name for people: conflict copies of this device's versions carry it.
    public var deviceName: String
    let logger: Logger

    /// The store's usage and quota as last seen (refreshed in the background, for df).
    private let usage = Mutex<StoreUsage?>(nil)
    private var usageCheckedAt = Date.distantPast

    public var storeUsage: StoreUsage? { usage.withLock { $0 } }

    /// Percent of each upload under way (as far as the store tells).
    final class Progress: @unchecked Sendable {
        private let lock = NSLock()
        private var percent: [UInt64: Int] = [:]
        func set(_ ino: UInt64, _ p: Int?) { lock.lock(); percent[ino] = p; lock.unlock() }
        func get(_ ino: UInt64) -> Int? { lock.lock(); defer { lock.unlock() }; return percent[ino] }
    }
    private let progress = Progress()

    /// How far the upload of `ino` has got, while one is under way (nil: none is).
    public func uploadPercent(_ ino: UInt64) -> Int? { progress.get(ino) }

    /// The uploading thread. Only a loop that waits with nothing to do is woken by a kick (a
    /// broadcast: `hurryAndWait` waits on the same condition). In a burst of changes (a `tar x`:
    /// several kicks a file) the loop looks again every 50 ms instead: it was woken 38,000 times
    /// for 10,000 new files, a context switch each.
    private let loop = BackgroundLoop()
    // Guarded by `cond`.
    private var cond: NSCondition { loop.cond }
    /// The next round uploads what is queued without waiting out the delay that gathers saves.
    private var hurried = false
    /// Rounds run for `hurry` that are over, and whether one is under way (for `hurryAndWait`).
    private var hurriedRoundsDone = 0
    /// Items sent back to the queue to go again at once (a move to wait for, a race lost, a
    /// key to write anew), since start: `flush` waits on while this grows.
    private var requeued = 0
    private var hurriedRoundRunning = false
    private var busyCheck: @Sendable (UInt64) -> Bool = { _ in false }
    private var quietCheck: @Sendable () -> TimeInterval = { .infinity }
    private var waitingSince: Date?
    /// No round before this: the state database could not record an outcome (a full disk),
    /// so uploading on would only send the same items again and again.
    private var pausedUntil = Date.distantPast
    /// The reason last logged for each item being retried: a condition that persists (a store
    /// away for hours, over quota) is said once, not at every try.
    private var retrySaid: [UInt64: String] = [:]
    /// Whether the pause for a state database that cannot record was said (once until it can).
    private var pauseSaid = false
    private var outcomeHook: @Sendable (UInt64, Bool) -> Void = { _, _ in }

    /// Uploads wait while local changes are still arriving (a `tar x`, a `cp -a`) so they
    /// do not compete with them for the disk, for at most `maxDeferral` seconds.
    public var quietPeriod: TimeInterval = 0.5
    public var maxDeferral: TimeInterval = 30

    /// Each store write goes to the log (the CLI's UBIQ_TRACE_UPLOADS=1: to follow a crash test's history).
    let tracing: Bool

    public init(state: LocalState, store: any CloudStore, coordinator: Coordinator, cache: ContentCache,
                deviceID: String, logger: Logger, tracing: Bool = false) {
        self.state = state; self.store = store; self.coordinator = coordinator; self.cache = cache
        self.deviceID = deviceID; self.logger = logger; self.tracing = tracing
        self.deviceName = String(deviceID.prefix(8))
    }

    /// `check(ino)` says whether the file is still being written (then it waits).
    public func setBusyCheck(_ check: @escaping @Sendable (UInt64) -> Bool) {
        cond.lock(); busyCheck = check; cond.unlock()
    }

    /// `hook(ino, conflict)` is told when an item's upload ended (done, failed, or a conflict).
    public func setOutcomeHook(_ hook: @escaping @Sendable (UInt64, Bool) -> Void) {
        cond.lock(); outcomeHook = hook; cond.unlock()
    }

    /// `check()` gives the seconds since the last local change.
    public func setQuietCheck(_ check: @escaping @Sendable () -> TimeInterval) {
        cond.lock(); quietCheck = check; cond.unlock()
    }

    /// True when uploads should wait for local activity to settle.
    private func shouldYield() -> Bool {
        cond.lock(); let quiet = quietCheck; cond.unlock()
        if quiet() >= quietPeriod { waitingSince = nil; return false }
        let since = waitingSince ?? Date()
        waitingSince = since
        if Date().timeIntervalSince(since) >= maxDeferral { waitingSince = nil; return false }
        return true
    }

    public func start() {
        loop.start(name: "ubiq-uploader") { [self] in round() }
    }

    /// Stops the background thread (after the round in progress).
    public func stop() { loop.stop() }

    /// Something was queued: look now rather than at the next tick.
    public func kick() {
        cond.lock(); loop.kickLocked(wake: false); cond.unlock()
    }

    /// The user asked for it (`ubiq sync`): upload everything queued now, not after the delay.
    public func hurry() {
        cond.lock(); hurried = true; loop.kickLocked(wake: true); cond.unlock()
    }

    /// Hurries, and waits (at most `timeout`) until a round that began after this call is
    /// over; false when none ended in time (or the uploader is not running).
    public func hurryAndWait(timeout: TimeInterval) -> Bool {
        cond.lock()
        defer { cond.unlock() }
        guard loop.running else { return false }
        let target = hurriedRoundsDone + (hurriedRoundRunning ? 2 : 1)
        hurried = true
        loop.kickLocked(wake: true)
        let deadline = Date(timeIntervalSinceNow: timeout)
        while hurriedRoundsDone < target && loop.running && Date() < deadline { _ = cond.wait(until: deadline) }
        return hurriedRoundsDone >= target
    }

    /// Sends what is queued now and waits while that makes progress (at most `timeout`):
    /// returns when the outbox is empty, or a round sent nothing more (offline, a quota, a
    /// file still open for writing). Items sent back to go again at once (waiting for another
    /// item's move, a key to write anew) count as progress for up to 20 rounds in a row.
    public func flush(timeout: TimeInterval) {
        let deadline = Date(timeIntervalSinceNow: timeout)
        var before = pendingCount
        var requeuedBefore = requeuedCount
        // Rounds in a row that only sent items back to the queue: a bound for a wait that
        // never resolves (each such round talks to the store, so this is not a spin).
        var onlyRequeued = 0
        while before > 0 && hurryAndWait(timeout: deadline.timeIntervalSinceNow) {
            let after = pendingCount
            let requeuedAfter = requeuedCount
            if after < before {
                onlyRequeued = 0
            } else if requeuedAfter > requeuedBefore && onlyRequeued < 20 {
                onlyRequeued += 1
            } else {
                return
            }
            before = after
            requeuedBefore = requeuedAfter
        }
    }

    /// One turn of the uploading thread: a round, then (when it sent nothing) a wait of up to
    /// 0.25 s for a kick, or 50 ms after one.
    private func round() -> BackgroundLoop.Pause {
        cond.lock()
        let now = hurried
        hurried = false
        if now { hurriedRoundRunning = true }
        cond.unlock()
        refreshUsage()
        let n = !now && shouldYield() ? 0 : processRound(ignoringDelay: now)
        cond.lock()
        if now { hurriedRoundRunning = false; hurriedRoundsDone += 1; cond.broadcast() }
        cond.unlock()
        return n == 0 ? BackgroundLoop.Pause(upTo: 0.25, atLeast: 0.05) : .none
    }

    /// Asks the store for its usage every 30 s (on the uploader's thread).
    public func refreshUsage(force: Bool = false) {
        guard force || Date().timeIntervalSince(usageCheckedAt) > 30 else { return }
        usageCheckedAt = Date()
        let store = self.store
        if let u = try? runBlocking({ try await store.usage() }) { usage.withLock { $0 = u } }
    }

    /// Uploads until the outbox is empty or `timeout` passes; true when empty.
    /// Delays meant to coalesce saves are ignored.
    public func drain(timeout: TimeInterval) -> Bool {
        let deadline = Date(timeIntervalSinceNow: timeout)
        while Date() < deadline {
            let pending = (try? state.read { try $0.outboxCount() }) ?? 1
            if pending == 0 { return true }
            if processRound(ignoringDelay: true) == 0 { Thread.sleep(forTimeInterval: 0.05) }
        }
        return ((try? state.read { try $0.outboxCount() }) ?? 1) == 0
    }

    public var pendingCount: Int { (try? state.read { try $0.outboxCount() }) ?? -1 }

    private var requeuedCount: Int { cond.lock(); defer { cond.unlock() }; return requeued }

    // MARK: - One round

    /// `setAside`: uploaded, after keeping the store's other version as a conflict copy.
    /// `localOnly`: kept on this device only by design (a name the store cannot hold): no error.
    /// `busy`: still being written here (it goes once the writer is done); `deferred`: sent back
    /// to the queue to go again at once.
    private enum Outcome { case done, retry(String), busy, deferred, setAside(String), conflict(String), permanent(String), localOnly(String) }

    /// Processes what is due; returns how many items were handled.
    @discardableResult
    public func processRound(ignoringDelay: Bool) -> Int {
        var handled = 0
        cond.lock(); let paused = Date() < pausedUntil; cond.unlock()
        if paused { return 0 }
        // Deletes first: a key freed by a delete may be taken by a new upload.
        let graves = (try? state.read { try $0.tombstones(limit: 256) }) ?? []
        for t in graves {
            do {
                if t.isLeftover {
                    // Where an upload went whose answer never came, from an item removed since:
                    // deleted if it is there and no item here records it.
                    if let leftover = try leftoverOfOurs(t.key) {
                        let store = self.store
                        trace("delete \(t.key) ifMatch(\(leftover)) (tombstone for an unanswered upload)")
                        try runBlocking { try await store.delete(t.key, condition: .ifMatch(leftover)) }
                    }
                    guard recordDone(tombstone: t.id) else { return handled }
                    handled += 1
                    continue
                }
                let cond: WriteCondition = t.version.map { .ifMatch($0) } ?? .always
                let store = self.store
                trace("delete \(t.key) \(cond) (tombstone)")
                try runBlocking { try await store.delete(t.key, condition: cond) }
            } catch StoreError.notFound {
            } catch StoreError.preconditionFailed {
                if let leftover = try? leftoverOfOurs(t.key) {
                    // This device's own later upload, whose answer it never had (a lost reply, a
                    // crash): the item it came from is gone here, so the delete covers it too.
                    let store = self.store
                    trace("delete \(t.key) ifMatch(\(leftover)) (tombstone, our unrecorded upload)")
                    do { try runBlocking { try await store.delete(t.key, condition: .ifMatch(leftover)) } } catch StoreError.notFound {
                    } catch StoreError.preconditionFailed {
                        logger.info("not deleting \(t.key): it changed in the store")
                    } catch {
                        logger.warning("delete of \(t.key) failed, will retry: \(error)")
                        return handled
                    }
                } else {
                    // Changed in the store since we last saw it: an edit elsewhere beats our delete.
                    logger.info("not deleting \(t.key): it changed in the store")
                }
            } catch {
                logger.warning("delete of \(t.key) failed, will retry: \(error)")
                return handled
            }
            guard recordDone(tombstone: t.id) else { return handled }
            handled += 1
        }
        let asOf = ignoringDelay ? Date.distantFuture : Date()
        let due = (try? state.read { try $0.dueOutbox(limit: 64, asOf: asOf) }) ?? []
        for item in due {
            let outcome: Outcome
            var diskFull = false
            cond.lock(); let busy = busyCheck; cond.unlock()
            if busy(item.ino) {
                outcome = .busy
            } else {
                do { outcome = try upload(item.ino) } catch let e as StoreError where e.isTransient {
                    outcome = .retry("\(e)")
                } catch StoreError.quotaExceeded(let key) {
                    // Kept here and tried again: space may free up in the store.
                    outcome = .retry("store quota exceeded writing \(key)")
                } catch let e as StoreError {
                    outcome = .permanent("\(e)")
                } catch let e as StateError {
                    // This device's disk, not the store: tried again soon, as space may free up.
                    if case .full = e { diskFull = true }
                    outcome = .retry("\(e)")
                } catch {
                    outcome = .retry("\(error)")
                }
            }
            do {
                try state.write { tx in
                    switch outcome {
                    case .done, .setAside:
                        try tx.completeOutbox(item.ino, seq: item.seq)
                    case .busy:
                        // Not tried: a file open for long does not make its later tries back off.
                        try tx.retryOutbox(item.ino, after: 0.5, attempt: false)
                    case .deferred:
                        // Sent back again and again (a store that refuses what it just said it has):
                        // backs off as a failure does, rather than asking the store twice a second.
                        try tx.retryOutbox(item.ino, after: item.attempts < 10 ? 0.5 : min(60, 0.5 * pow(2, Double(min(item.attempts - 10, 7)))))
                    case .retry(let why):
                        try tx.setUploadError(item.ino, why)
                        try tx.retryOutbox(item.ino, after: diskFull ? 2 : min(60, 0.5 * pow(2, Double(min(item.attempts, 7)))))
                    case .conflict(let why):
                        try tx.setUploadError(item.ino, why, conflict: true)
                        try tx.completeOutbox(item.ino, seq: item.seq)
                    case .permanent(let why):
                        try tx.setUploadError(item.ino, why)
                        try tx.completeOutbox(item.ino, seq: item.seq)
                    case .localOnly(let why):
                        try tx.setUploadError(item.ino, why, localOnly: true)
                        try tx.completeOutbox(item.ino, seq: item.seq)
                    }
                }
                cond.lock(); let said = pauseSaid; pauseSaid = false; cond.unlock()
                if said { logger.notice("uploads go on: outcomes are recorded again") }
            } catch {
                // Not recorded: the item stays due. Pause rather than send it again at once.
                pause(because: "outbox update failed: \(error)")
                return handled
            }
            cond.lock(); let hook = outcomeHook; cond.unlock()
            switch outcome {
            case .done, .permanent, .retry, .localOnly: hook(item.ino, false)
            case .conflict, .setAside: hook(item.ino, true)
            case .busy, .deferred: break
            }
            cond.lock()
            if case .deferred = outcome { requeued += 1 }
            let sayRetry: Bool
            if case .retry(let why) = outcome {
                sayRetry = retrySaid[item.ino] != why
                retrySaid[item.ino] = why
            } else {
                sayRetry = false
                switch outcome {
                case .busy, .deferred: break
                default: retrySaid[item.ino] = nil
                }
            }
            cond.unlock()
            switch outcome {
            case .retry(let why): if sayRetry { logger.warning("upload of inode \(item.ino) failed, will retry (said once while the reason stays): \(why)") }
            case .setAside(let copy): logger.notice("upload of inode \(item.ino): the store had another device's version; kept it as \(copy)")
            case .conflict(let why), .permanent(let why): logger.error("upload of inode \(item.ino): \(why)")
            case .localOnly(let why): logger.info("\(why)")
            default: break
            }
            handled += 1
        }
        return handled
    }

    /// Removes a tombstone whose delete was done; false (and a pause) when that could not be
    /// recorded.
    private func recordDone(tombstone id: Int64) -> Bool {
        do {
            try state.write { try $0.removeTombstone(id) }
            return true
        } catch {
            pause(because: "tombstone update failed: \(error)")
            return false
        }
    }

    /// Pauses uploads 2 s: the state database could not record what was done (a full disk).
    /// Said once, until outcomes are recorded again.
    private func pause(because why: String) {
        cond.lock()
        pausedUntil = Date(timeIntervalSinceNow: 2)
        let said = pauseSaid
        pauseSaid = true
        cond.unlock()
        if !said { logger.error("\(why); uploads pause, and are tried again every 2 s") }
    }

    private struct Snapshot {
        var rec: InodeRecord
        var upload: UploadState
        var entries: [(EntryRecord, String?)]
        var xattrs: [[UInt8]: [UInt8]]
    }

    private func snapshot(_ ino: UInt64) throws -> Snapshot? {
        try state.read { tx in
            guard let rec = try tx.inode(ino), let up = try tx.uploadState(ino) else { return nil }
            let entries = try tx.entries(of: ino).map { ($0, try Self.path(of: $0, tx)) }
            return Snapshot(rec: rec, upload: up, entries: entries, xattrs: try tx.xattrs(ino))
        }
    }

    /// The store key of an entry (nil when a name is not valid UTF-8 or the entry is detached).
    static func path(of entry: EntryRecord, _ tx: StateTransaction) throws -> String? {
        var names = [entry.name]
        var parent = entry.parent
        var depth = 0
        while parent != 1 {
            guard let up = try tx.entries(of: parent).first, depth < 4096 else { return nil }
            names.append(up.name)
            parent = up.parent
            depth += 1
        }
        var parts: [String] = []
        for n in names.reversed() {
            guard let s = String(validating: n, as: UTF8.self) else { return nil }
            parts.append(s)
        }
        return parts.joined(separator: "/")
    }

    private func metadata(_ s: Snapshot, generation: Int64) -> ObjectMetadata {
        var x: [String: Data] = [:]
        for (k, v) in s.xattrs {
            if let name = String(validating: k, as: UTF8.self) { x[name] = Data(v) }
        }
        return ObjectMetadata(kind: Self.kind(s.rec.type), mode: s.rec.perm, uid: s.rec.uid, gid: s.rec.gid,
                              mtimeNs: s.rec.mtimeNs, rdev: s.rec.rdev, target: s.rec.target.map { Data($0) },
                              xattrs: x, origin: origin(s.rec.ino, generation), device: deviceName)
    }

    private func origin(_ ino: UInt64, _ generation: Int64) -> String { "\(deviceID):\(ino):\(generation)" }

    static func kind(_ type: UInt32) -> ObjectKind {
        switch type {
        case S_IFDIR: return .directory
        case S_IFLNK: return .symlink
        case S_IFIFO: return .fifo
        case S_IFSOCK: return .socket
        case S_IFCHR: return .charDevice
        case S_IFBLK: return .blockDevice
        default: return .file
        }
    }

    private func trace(_ what: @autoclosure () -> String) {
        if tracing { logger.info("upload trace: \(what())") }
    }

    private func upload(_ ino: UInt64) throws -> Outcome {
        guard var s = try snapshot(ino) else { return .done }
        if s.entries.isEmpty { return .done }  // removed: its tombstones do the rest
        let isDir = s.rec.type == UInt32(S_IFDIR)
        let isRegular = s.rec.type == UInt32(S_IFREG)
        let contentDirty = s.rec.contentGen > s.upload.uploadedContentGen
        let metaDirty = s.rec.metaGen > s.upload.uploadedMetaGen
        var staged: URL?
        var stagedIsCopy = true
        // Held through the put when there was no room to stage a copy (see below).
        var heldClaim: Claim?
        // Other devices' versions kept as conflict copies on the way.
        var setAside: [String] = []
        defer {
            if let staged, stagedIsCopy { unlink(staged.path) }
            if let heldClaim { coordinator.release(heldClaim) }
            // Kept until the upload is recorded (else the percent would read 0 in between).
            progress.set(ino, nil)
        }
        let store = self.store

        for (entry, path) in s.entries {
            guard let path else {
                return .localOnly("a name on the way to inode \(ino) is not valid UTF-8: kept on this device only")
            }
            let key = isDir ? path + "/" : path
            let needsPut = entry.remoteKey == nil || (!isDir && contentDirty)
            if needsPut {
                if isRegular && staged == nil && s.rec.present {
                    // Snapshot under an upload claim: writers wait, readers go on.
                    let claim: Claim
                    do { claim = try coordinator.claim(ino, .upload) } catch { return .retry("\(error)") }
                    var keep = false
                    defer { if !keep { coordinator.release(claim) } }
                    guard let fresh = try snapshot(ino) else { return .done }
                    s = fresh
                    // The store gets only bytes this device cannot lose: a close commits without
                    // syncing, so what it committed is made durable first (the record of it too).
                    do { try cache.sync(ino) } catch { return .retry("\(error)") }
                    state.syncToDisk()
                    do {
                        staged = try cache.stage(ino, generation: s.rec.contentGen)
                    } catch let e as LocalWriteError where e.errno == ENOSPC || e.errno == EDQUOT {
                        // No room for a copy: send the cache file itself, and keep writers
                        // out until it is sent (readers go on).
                        logger.info("no room to stage inode \(ino) for upload; uploading it in place")
                        staged = URL(fileURLWithPath: cache.path(ino))
                        stagedIsCopy = false
                        heldClaim = claim
                        keep = true
                    }
                }
                if isRegular && !s.rec.present && entry.remoteKey != nil {
                    // A placeholder whose content is in the store already: a move/metadata case, below.
                } else {
                    let condition: WriteCondition = (entry.remoteKey?.sameBytes(key) == true && entry.remoteVersion != nil)
                        ? .ifMatch(entry.remoteVersion!) : .ifAbsent
                    // The digest of the staged bytes goes with them (checked by every download).
                    var described = metadata(s, generation: s.rec.contentGen)
                    if let staged {
                        do { described.sha256 = try ContentDigest.of(path: staged.path) } catch { return .retry("\(error)") }
                    }
                    let meta = described
                    let source = staged
                    let total = max(1, s.rec.size)
                    let progress = self.progress
                    func send(_ condition: WriteCondition) throws -> ObjectInfo {
                        progress.set(ino, 0)
                        let report: @Sendable (Int64) -> Void = { sent in progress.set(ino, Int(min(99, sent * 100 / total))) }
                        trace("put \(key) \(condition) ino \(ino) gen \(s.rec.contentGen)")
                        return try runBlocking {
                            try await store.put(key, contentsOf: source, metadata: meta, condition: condition, progress: report)
                        }
                    }
                    // Should the answer never come and the item be removed, the key is checked then.
                    if entry.remoteKey?.sameBytes(key) != true { try state.write { try $0.markSent(ino, key: key) } }
                    let info: ObjectInfo
                    do {
                        info = try send(condition)
                    } catch StoreError.preconditionFailed(_, let current) {
                        switch try resolveTaken(key: key, entryID: entry.id, ino: ino, generation: s.rec.contentGen, isDir: isDir,
                                                 condition: condition, current: current) {
                        case .adopt(let found):
                            try removeOld(entry, newKey: key, tombstone: try recordAt(entry, key: key, found))
                            continue
                        case .wait:
                            try breakRenameCycle(entry, to: key, s)
                            return .deferred
                        case .conflict(let why): return .conflict(why)
                        case .over(let theirs, let copy):
                            do { info = try send(theirs.map { .ifMatch($0) } ?? .ifAbsent) } catch StoreError.preconditionFailed {
                                undoSetAside(copy)
                                return .deferred  // changed again meanwhile: start over
                            }
                            if let copy { setAside.append(copy.key) }
                        }
                    }
                    try removeOld(entry, newKey: key, tombstone: try recordAt(entry, key: key, info))
                    continue
                }
            }
            guard let oldKey = entry.remoteKey, let oldVersion = entry.remoteVersion else { continue }
            if !oldKey.sameBytes(key) {
                // Moved: server-side copy, then drop the old key. No content leaves the store.
                let meta = metadata(s, generation: s.rec.contentGen)
                func copy(_ condition: WriteCondition) throws -> ObjectInfo {
                    trace("copy \(oldKey)@\(oldVersion) to \(key) \(condition) ino \(ino)")
                    return try runBlocking {
                        try await store.copy(from: oldKey, version: oldVersion, to: key, metadata: meta, condition: condition)
                    }
                }
                try state.write { try $0.markSent(ino, key: key) }
                let info: ObjectInfo
                do {
                    info = try copy(.ifAbsent)
                } catch StoreError.notFound where !isRegular || s.rec.present {
                    // What it moved from is gone from the store (deleted, or written over, on
                    // another device meanwhile; a store without old versions cannot copy it):
                    // what is here goes up anew under the new name, and the old key is left alone.
                    logger.info("\(oldKey) is gone from the store: inode \(ino) goes up anew as \(key)")
                    try state.write { try $0.setRemote(entryID: entry.id, key: nil, version: nil) }
                    return .deferred
                } catch StoreError.preconditionFailed(_, let current) {
                    switch try resolveTaken(key: key, entryID: entry.id, ino: ino, generation: s.rec.contentGen, isDir: isDir,
                                             condition: .ifAbsent, current: current) {
                    case .adopt(let found):
                        try removeOld(entry, newKey: key, tombstone: try recordAt(entry, key: key, found))
                        continue
                    case .wait:
                        try breakRenameCycle(entry, to: key, s)
                        return .deferred
                    case .conflict(let why): return .conflict(why)
                    case .over(let theirs, let aside):
                        do { info = try copy(theirs.map { .ifMatch($0) } ?? .ifAbsent) } catch StoreError.preconditionFailed, StoreError.notFound {
                            undoSetAside(aside)
                            return .deferred
                        }
                        if let aside { setAside.append(aside.key) }
                    }
                }
                try removeOld(entry, newKey: key, tombstone: try recordAt(entry, key: key, info))
            } else if metaDirty {
                let meta = metadata(s, generation: s.rec.contentGen)
                do {
                    trace("copy \(key)@\(oldVersion) onto itself (metadata) ino \(ino)")
                    let info = try runBlocking {
                        try await store.copy(from: key, version: oldVersion, to: key, metadata: meta, condition: .ifMatch(oldVersion))
                    }
                    try state.write { try $0.recordRemote(entryID: entry.id, key: key, info) }
                } catch let e as StoreError where e.isPreconditionFailed || e.isNotFound {
                    trace("\(key): \(e)")
                    // Changed in the store, or gone (a store without old versions cannot copy
                    // the version this device knows): merged, or written again.
                    switch try mergeMetadata(key: key, entry: entry, meta: meta, isPlaceholder: isRegular && !s.rec.present) {
                    case .merged: break
                    case .again: return .deferred
                    case .dropped: return .done
                    }
                }
            }
        }
        try state.write { try $0.markUploaded(ino, contentGen: s.rec.contentGen, metaGen: s.rec.metaGen) }
        return setAside.isEmpty ? .done : .setAside(setAside.joined(separator: ", "))
    }

    private enum Merge { case merged, again, dropped }

    /// A metadata change (chmod, chown, xattrs, times) met a newer version in the store.
    /// Metadata merges: this device's goes on top of the store's version, whatever its bytes.
    /// When those bytes are new to this device, the entry is left at its old version, and the
    /// merged version is not marked as this device's own, so the ChangeFeed brings the bytes.
    private func mergeMetadata(key: String, entry: EntryRecord, meta: ObjectMetadata, isPlaceholder: Bool) throws -> Merge {
        let store = self.store
        let current: ObjectInfo
        do { current = try runBlocking { try await store.head(key) } } catch StoreError.notFound {
            // Deleted in the store. What is here in full is written again (an edit beats a
            // delete); a placeholder goes with the delete (the ChangeFeed removes it).
            if isPlaceholder { return .dropped }
            try state.write { try $0.setRemote(entryID: entry.id, key: nil, version: nil) }
            return .again
        }
        let sameBytes = current.contentTag != nil && current.contentTag == entry.remoteTag
        var merged = meta
        if !sameBytes {
            merged.origin = "merge:\(deviceID)"
            merged.mtimeNs = current.metadata.mtimeNs
        }
        let final = merged
        let info: ObjectInfo
        do {
            info = try runBlocking {
                try await store.copy(from: key, version: current.version, to: key, metadata: final, condition: .ifMatch(current.version))
            }
        } catch StoreError.preconditionFailed { return .again } catch StoreError.notFound { return .again }
        if sameBytes { try state.write { try $0.recordRemote(entryID: entry.id, key: key, info) } }
        return .merged
    }

    /// The versions the store keeps of `key`, newest first (`ubiq versions --all`).
    public func history(of key: String) throws -> [ObjectInfo] {
        let store = self.store
        return try runBlocking { try await store.versions(of: key) }
    }

    /// Copies `version` of `key`, in the store, as its newest version, provided the current
    /// version is still `current` (`ubiq restore`). Nothing is downloaded; every device's
    /// ChangeFeed brings it in, this one's too. Returns the new version, or nil when the store
    /// does not keep `version`. Throws `preconditionFailed` when the key changed meanwhile.
    public func restore(key: String, version: String, over current: String) throws -> String? {
        guard let old = try history(of: key).first(where: { $0.version == version }) else { return nil }
        if old.version == current { return current }
        var meta = old.metadata
        meta.origin = "restore:\(deviceID)"
        meta.device = deviceName
        let restored = meta
        let store = self.store
        return try runBlocking {
            try await store.copy(from: key, version: old.version, to: key, metadata: restored, condition: .ifMatch(current))
        }.version
    }

    /// Names swapped (`mv a t; mv b a; mv t b`), or rotated: each item's new key is held by
    /// another of ours that is itself waiting to move, so none can go first. The one whose
    /// bytes are here (or that has none: a folder, a link) breaks the cycle: its old key is
    /// deleted (left alone if another device wrote there since) and it goes up again as a new
    /// item once its new key is free.
    private func breakRenameCycle(_ entry: EntryRecord, to key: String, _ s: Snapshot) throws {
        guard let oldKey = entry.remoteKey, !oldKey.sameBytes(key), s.rec.type != UInt32(S_IFREG) || s.rec.present else { return }
        let cycle = try state.read { tx -> Bool in
            var target = key
            var seen: Set<KeyBytes> = []
            for _ in 0 ..< 64 {
                guard let holder = try tx.entries(remoteKey: target).first(where: { $0.id != entry.id }),
                      let path = try Self.path(of: holder, tx), let rec = try tx.inode(holder.ino) else { return false }
                let wanted = rec.type == UInt32(S_IFDIR) ? path + "/" : path
                if wanted.sameBytes(oldKey) { return true }
                if wanted.sameBytes(target) || !seen.insert(KeyBytes(wanted)).inserted { return false }
                target = wanted
            }
            return false
        }
        guard cycle else { return }
        let store = self.store
        do {
            trace("delete \(oldKey) \(entry.remoteVersion ?? "always") (rename cycle)")
            try runBlocking { try await store.delete(oldKey, condition: entry.remoteVersion.map { .ifMatch($0) } ?? .always) }
        } catch StoreError.notFound {
        } catch StoreError.preconditionFailed {
            // Another device wrote there since: its version stays (an edit beats the delete
            // a rename implies), and this item still goes up anew under its new name.
            logger.info("left \(oldKey) in the store: it changed there since")
        }
        try state.write { try $0.setRemote(entryID: entry.id, key: nil, version: nil) }
        logger.info("names swapped: \(oldKey) is sent again as \(key) once that name is free")
    }

    /// Records that `entry` now stands for `key` at `version`. Where it stood before (another
    /// key) gets a tombstone in the same transaction: the old object is deleted even when the
    /// delete fails now or this device stops before it (else it would come back as a file).
    /// Returns the tombstone's id.
    private func recordAt(_ entry: EntryRecord, key: String, _ info: ObjectInfo) throws -> Int64? {
        try state.write { tx -> Int64? in
            try tx.recordRemote(entryID: entry.id, key: key, info)
            guard let old = entry.remoteKey, !old.sameBytes(key) else { return nil }
            return try tx.addTombstone(key: old, version: entry.remoteVersion)
        }
    }

    /// After an entry's object was written at `newKey`, delete where it was before, and drop
    /// the tombstone `recordAt` left for it (which, should this fail, deletes it later).
    private func removeOld(_ entry: EntryRecord, newKey: String, tombstone: Int64?) throws {
        guard let old = entry.remoteKey, old != newKey else { return }
        let version = entry.remoteVersion
        let store = self.store
        do {
            trace("delete \(old) \(version ?? "always") (moved to \(newKey))")
            try runBlocking { try await store.delete(old, condition: version.map { .ifMatch($0) } ?? .always) }
        } catch StoreError.notFound {
        } catch StoreError.preconditionFailed {
            logger.info("left \(old) in the store: it changed there since")
        }
        if let tombstone { try state.write { try $0.removeTombstone(tombstone) } }
    }

    /// The store's current version of `key` when this device wrote it and no item here records
    /// it: an upload whose answer never came (a lost reply, a crash), from an item since deleted,
    /// renamed or written again here. Nil otherwise (another device's version, or one recorded).
    private func leftoverOfOurs(_ key: String) throws -> String? {
        let store = self.store
        let info = try runBlocking { try await store.head(key) }
        return try isUnrecordedOfOurs(info, at: key) ? info.version : nil
    }

    /// Whether `info`, the store's version at `key`, is one this device wrote that no item here records.
    private func isUnrecordedOfOurs(_ info: ObjectInfo, at key: String) throws -> Bool {
        guard let origin = info.metadata.origin, origin.hasPrefix(deviceID + ":") else { return false }
        return try !state.read { try $0.entries(remoteKey: key).contains { $0.remoteVersion == info.version } }
    }

    /// `over(version, copy)`: write again over the store's `version` (nil: the key is free
    /// now), its content kept at `copy` first.
    private enum Taken { case adopt(ObjectInfo), wait, conflict(String), over(String?, copy: (key: String, version: String)?) }

    /// A conditional write found the key taken. Decide whose it is.
    private func resolveTaken(key: String, entryID: Int64, ino: UInt64, generation: Int64, isDir: Bool,
                              condition: WriteCondition, current: String?) throws -> Taken {
        let store = self.store
        let info: ObjectInfo
        do { info = try runBlocking { try await store.head(key) } } catch StoreError.notFound {
            // Deleted in the store meanwhile: an edit beats a delete.
            return isDir ? .wait : .over(nil, copy: nil)
        } catch { return .wait }
        trace("\(key) taken by \(info.version) from \(info.metadata.origin ?? "?") (ino \(ino) gen \(generation))")
        // Our own upload from before a crash, recorded in the store but not here.
        if info.metadata.origin == origin(ino, generation) { return .adopt(info) }
        // Another name of ours still sits there and is about to move away (or be deleted).
        // Asked before folders merge: a folder that adopted the marker of one moved away
        // would be left with none once the move deletes it.
        if condition == .ifAbsent {
            let held = try state.read { tx in
                try tx.entries(remoteKey: key).contains { $0.id != entryID } || tx.hasTombstone(key: key)
            }
            if held { return .wait }
        }
        // Folders merge: the same folder made on two devices is one folder.
        if isDir && info.metadata.kind == .directory && condition == .ifAbsent { return .adopt(info) }
        // This device's own upload whose answer never came, from an item since deleted or
        // renamed here: nothing of another device's to keep, so this write goes over it.
        if !isDir, try isUnrecordedOfOurs(info, at: key) {
            trace("\(key): our own unrecorded upload \(info.version) is written over")
            return .over(info.version, copy: nil)
        }
        let why = "\(key) changed in the store since this device last saw it (now \(current ?? "?"))"
        if isDir { return .conflict(why) }
        // Both sides changed it: this device's version takes the name, the store's is kept
        // beside it as a conflict copy that every device sees.
        let kept: (key: String, version: String)?
        do { kept = try keepAsConflictCopy(key: key, theirs: info) } catch StoreError.notFound {
            return .wait  // their version went away meanwhile: start over
        }
        guard let copy = kept else { return .conflict(why) }
        return .over(info.version, copy: copy)
    }

    /// Copies (in the store) `theirs` to a conflict copy's name beside `key`. Nil when no
    /// name could be had. A copy left by an attempt that crashed is found and used again.
    private func keepAsConflictCopy(key: String, theirs: ObjectInfo) throws -> (key: String, version: String)? {
        let store = self.store
        let slash = key.lastIndex(of: "/")
        let folder = slash.map { String(key[...$0]) } ?? ""
        let name = slash.map { String(key[key.index(after: $0)...]) } ?? key
        let device = theirs.metadata.device ?? theirs.metadata.origin.map { String($0.prefix(8)) } ?? "unknown"
        let date = Date(timeIntervalSince1970: Double(theirs.metadata.mtimeNs) / 1e9)
        var copyMeta = theirs.metadata
        // Not any device's own write, this one's included: every ChangeFeed brings it in.
        copyMeta.origin = "conflict-copy:\(deviceID)"
        let meta = copyMeta
        for n in 1...50 {
            let copyKey = folder + ConflictName.make(for: name, device: device, date: date, counter: n)
            do {
                let made = try runBlocking {
                    try await store.copy(from: key, version: theirs.version, to: copyKey, metadata: meta, condition: .ifAbsent)
                }
                return (copyKey, made.version)
            } catch StoreError.preconditionFailed {
                let there = try? runBlocking { try await store.head(copyKey) }
                if let there, there.contentTag != nil, there.contentTag == theirs.contentTag { return (copyKey, there.version) }
            }
        }
        logger.error("no free name for a conflict copy of \(key)")
        return nil
    }

    /// Removes a conflict copy made for a write that then lost another race (it starts over).
    private func undoSetAside(_ copy: (key: String, version: String)?) {
        guard let copy else { return }
        let store = self.store
        try? runBlocking { try await store.delete(copy.key, condition: .ifMatch(copy.version)) }
    }
}
