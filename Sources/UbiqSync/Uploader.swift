import Foundation
import UbiqClock
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
    /// Each write it makes, noted for the change feed (`StoreWrites`).
    public let writes: StoreWrites
    let coordinator: Coordinator
    let cache: ContentCache
    let deviceID: String
    /// This device's name for people: conflict copies of this device's versions carry it.
    public var deviceName: String
    let logger: Logger

    /// The store's usage and quota as last seen (refreshed in the background, for df).
    let usage = Mutex<StoreUsage?>(nil)
    var usageCheckedAt = Date.distantPast

    public var storeUsage: StoreUsage? { usage.withLock { $0 } }

    /// Percent of each upload under way (as far as the store tells).
    final class Progress: @unchecked Sendable {
        private let lock = NSLock()
        private var percent: [UInt64: Int] = [:]
        func set(_ ino: UInt64, _ p: Int?) { lock.lock(); percent[ino] = p; lock.unlock() }
        func get(_ ino: UInt64) -> Int? { lock.lock(); defer { lock.unlock() }; return percent[ino] }
    }
    let progress = Progress()

    /// How far the upload of `ino` has got, while one is under way (nil: none is).
    public func uploadPercent(_ ino: UInt64) -> Int? { progress.get(ino) }

    /// The uploading thread. Only a loop that waits with nothing to do is woken by a kick (a
    /// broadcast: `hurryAndWait` waits on the same condition). In a burst of changes (a `tar x`:
    /// several kicks a file) the loop looks again every 50 ms instead: it was woken 38,000 times
    /// for 10,000 new files, a context switch each.
    let loop: BackgroundLoop
    // Guarded by `cond`.
    var cond: NSCondition { loop.cond }
    /// The next round uploads what is queued without waiting out the delay that gathers saves.
    var hurried = false
    /// Rounds run for `hurry` that are over, and whether one is under way (for `hurryAndWait`).
    var hurriedRoundsDone = 0
    /// Items sent back to the queue to go again at once (a move to wait for, a race lost, a
    /// key to write anew), since start: `flush` waits on while this grows.
    var requeued = 0
    var hurriedRoundRunning = false
    /// The file system it uploads for (`attach`), held weakly.
    private weak var host: (any UploadHost)?
    var waitingSince: Date?
    /// No round before this: the state database could not record an outcome (a full disk),
    /// so uploading on would only send the same items again and again.
    var pausedUntil = Date.distantPast
    /// The reason last logged for each item being retried: a condition that persists (a store
    /// away for hours, over quota) is said once, not at every try.
    var retrySaid: [UInt64: String] = [:]
    /// Whether the pause for a state database that cannot record was said (once until it can).
    var pauseSaid = false

    /// Uploads wait while local changes are still arriving (a `tar x`, a `cp -a`), so they do
    /// not compete with them for the disk, for at most `maxDeferral` seconds; and while files'
    /// bytes are being read (a cold `grep -r`) for at most `maxReadDeferral`, after which reads
    /// hold none for as long again (a reader that never stops, a player or an indexer, costs
    /// uploads half their time, not all of it).
    public var quietPeriod: TimeInterval = 0.5
    public var maxDeferral: TimeInterval = 30
    public var maxReadDeferral: TimeInterval = 5
    var readWaitingSince: Date?
    var readsHoldNoneUntil = Date.distantPast

    /// Items sent to the store at once (`--transfers`): 1 sends one item at a time, in the
    /// outbox's order (`uploadSideBySide`). Set before `start`.
    public var transfers = 1

    /// Each store write goes to the log (the CLI's UBIQ_TRACE_UPLOADS=1: to follow a crash test's history).
    let tracing: Bool
    /// The user's pause (set once, before the thread starts): nothing goes up while it lasts.
    public var pause: SyncPause?

    public init(state: LocalState, store: any CloudStore, coordinator: Coordinator, cache: ContentCache,
                deviceID: String, logger: Logger, tracing: Bool = false, writes: StoreWrites = StoreWrites()) {
        self.writes = writes
        self.state = state; self.store = store; self.coordinator = coordinator; self.cache = cache
        loop = BackgroundLoop(time: state.time)
        self.deviceID = deviceID; self.logger = logger; self.tracing = tracing
        self.deviceName = String(deviceID.prefix(8))
    }

    /// The file system it uploads for: asked whether a file is still being written and how
    /// long things have been quiet, told when an upload ends. Once, before `start`.
    public func attach(host: any UploadHost) {
        cond.lock(); self.host = host; cond.unlock()
    }

    /// The attached host (nil: none, or gone).
    var uploadHost: (any UploadHost)? {
        cond.lock(); defer { cond.unlock() }
        return host
    }

    /// True when uploads should wait for local activity to settle.
    func shouldYield() -> Bool {
        let host = uploadHost
        let now = state.time.now
        if (host?.secondsSinceLastChange ?? .infinity) < quietPeriod {
            return Self.stillWaiting(since: &waitingSince, atMost: maxDeferral, now: now)
        }
        waitingSince = nil
        guard (host?.secondsSinceLastRead ?? .infinity) < quietPeriod, now >= readsHoldNoneUntil else {
            readWaitingSince = nil
            return false
        }
        if Self.stillWaiting(since: &readWaitingSince, atMost: maxReadDeferral, now: now) { return true }
        readsHoldNoneUntil = now.addingTimeInterval(maxReadDeferral)
        return false
    }

    /// Whether a wait that began at `since` (now, when nil) is shorter than `atMost`; once it is
    /// not, the wait is over (`since` nil).
    private static func stillWaiting(since: inout Date?, atMost: TimeInterval, now: Date) -> Bool {
        let start = since ?? now
        since = start
        if now.timeIntervalSince(start) < atMost { return true }
        since = nil
        return false
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
        let deadline = Deadline(in: timeout)
        while hurriedRoundsDone < target && loop.running && !deadline.passed { deadline.wait(cond) }
        return hurriedRoundsDone >= target
    }

    /// Sends what is queued now and waits while that makes progress (at most `timeout`):
    /// returns when the outbox is empty, or a round sent nothing more (offline, a quota, a
    /// file still open for writing). Items sent back to go again at once (waiting for another
    /// item's move, a key to write anew) count as progress for up to 20 rounds in a row.
    public func flush(timeout: TimeInterval) {
        // What the rounds held back (a move under way) goes to the store's feed too.
        defer { publishChanges() }
        let deadline = Deadline(in: timeout)
        var before = pendingCount
        var requeuedBefore = requeuedCount
        // Rounds in a row that only sent items back to the queue: a bound for a wait that
        // never resolves (each such round talks to the store, so this is not a spin).
        var onlyRequeued = 0
        while before > 0 && hurryAndWait(timeout: deadline.remaining) {
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
    func round() -> BackgroundLoop.Pause {
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
        guard force || state.time.now.timeIntervalSince(usageCheckedAt) > 30 else { return }
        usageCheckedAt = state.time.now
        let store = self.store
        if let u = try? runBlocking({ try await store.usage() }) { usage.withLock { $0 = u } }
    }

    /// Uploads until the outbox is empty or `timeout` passes; true when empty.
    /// Delays meant to coalesce saves are ignored.
    public func drain(timeout: TimeInterval) -> Bool {
        let deadline = Deadline(in: timeout)
        while !deadline.passed {
            let pending = (try? state.read { try $0.outboxCount() }) ?? 1
            if pending == 0 { return true }
            if processRound(ignoringDelay: true) == 0 { Thread.sleep(forTimeInterval: 0.05) }
        }
        return ((try? state.read { try $0.outboxCount() }) ?? 1) == 0
    }

    /// Hands the store's feed everything this device changed, moves under way included (at
    /// the end of a `flush` and before the daemon exits).
    public func publishAll() { publishChanges() }

    public var pendingCount: Int { (try? state.read { try $0.outboxCount() }) ?? -1 }

    var requeuedCount: Int { cond.lock(); defer { cond.unlock() }; return requeued }
}
