import Foundation
import UbiqClock
import Logging
import UbiqState
import UbiqStore

/// What the store holds at a key now: the current object, or nil (deleted).
public struct RemoteChange: Sendable, Equatable {
    public var key: String
    public var info: ObjectInfo?
    /// The version of `key` this device had recorded just before it asked the store (nil:
    /// none). This device's uploader may write the key between that question and the change's
    /// application; a recorded version that differs by then says so, and the change is looked
    /// at again at the next poll rather than applied over what was just uploaded.
    public var recordedBefore: String?
    /// When the store was asked, in this device's count of its writes (`StoreWrites`): a key
    /// this device wrote since is looked at again at the next poll (nil: not checked).
    public var askedAt: UInt64?
    public init(key: String, info: ObjectInfo?, recordedBefore: String? = nil, askedAt: UInt64? = nil) {
        self.key = key; self.info = info; self.recordedBefore = recordedBefore; self.askedAt = askedAt
    }
}

/// Follows the store's change cursor and hands each changed key's current state to the
/// filesystem (its `RemoteChangeSink`), which turns it into placeholders, updates and removals.
///
/// Polls every `interval` seconds and at once on `kick()` (`ubiq sync`). The cursor is
/// saved in LocalState only after a batch is applied, so a crash replays a batch (applying
/// is idempotent: a key already at its version is left alone). Keys the applier could not
/// apply yet (a reader has the file open) are kept in LocalState and tried at every poll.
/// Changes this device wrote itself (its origin tag) are skipped: the uploader records them.
public final class ChangeFeed: @unchecked Sendable {
    let store: any CloudStore
    let state: LocalState
    let deviceID: String
    let logger: Logger
    /// Seconds between polls.
    public let interval: TimeInterval
    /// Changes asked for per request.
    public var batchSize = 1000

    static let cursorKey = "feed_cursor"

    /// The polling thread.
    private let loop: BackgroundLoop
    /// Guards `lastPoll`.
    private var cond: NSCondition { loop.cond }
    /// Polls in a row that failed (the thread's own).
    private var failures = 0
    /// Where the changes found go (the file system), and the key-value store's (its mirror).
    private let changes: any RemoteChangeSink
    private let keyValues: (any KeyValueSink)?
    /// One poll at a time (the thread's, or a caller's `poll()`).
    private let pollLock = NSLock()
    /// When the last poll reached the store (nil: never), and its error if it failed.
    private var lastPoll: (at: Date, error: String?)?
    /// When a poll last reached the store and took its changes (under `cond`).
    private var lastReached: Date?
    /// The first poll's listing (`importFirst`) is not over yet (under `cond`).
    private var listingPending = false
    /// That listing brings in the rest of a store this device was new to (it never had the
    /// whole of its listing): a name not here may be in the store still (under `cond`).
    private var bringingTheRest = false
    /// Every key of the store up to this one (bytes) is here (that listing's progress, under `cond`).
    private var listedThrough: [UInt8] = []
    /// The last attempt at that listing failed, or the feed stopped (under `cond`).
    private var listingHalted = false
    /// What was said of keys that could not be taken, so each is said once (under `pollLock`).
    private var warned = Set<KeyBytes>()
    /// The listing the first poll brings in before it reads the changes (`importFirst`; under `pollLock`).
    private var importer: Importer?

    /// This device's writes to the store (the uploader's): what a poll asked is stale for a key
    /// written since.
    let writes: StoreWrites
    /// What waits for the next polls' changes (`afterEachPoll`).
    private let waits: PollWaits
    /// The user's pause (set once, before the thread starts): no poll while it lasts.
    public var pause: SyncPause?

    public init(store: any CloudStore, state: LocalState, deviceID: String, logger: Logger, interval: TimeInterval = 3,
                changes: any RemoteChangeSink, keyValues: (any KeyValueSink)? = nil, writes: StoreWrites = StoreWrites()) {
        self.writes = writes
        self.store = store; self.state = state; self.deviceID = deviceID; self.logger = logger
        waits = PollWaits(time: state.time)
        self.interval = interval; self.changes = changes; self.keyValues = keyValues
        loop = BackgroundLoop(time: state.time)
    }

    /// Call before the first listing of the store (the Importer): records where the feed
    /// starts, so nothing that changes while the listing is taken is missed. A store whose
    /// cursor is a listing lists its first `listingFirst` objects only (the importer's bound:
    /// `CloudStore.startingCursor`).
    public static func prepare(store: any CloudStore, state: LocalState, listingFirst: Int = Importer.beforeMount) throws {
        if try state.read({ try $0.meta(cursorKey) }) != nil { return }
        let cursor = try runBlocking { try await store.startingCursor(listingFirst: listingFirst) }
        try state.write { try $0.setMeta(cursorKey, cursor) }
    }

    public func start() {
        loop.start(name: "ubiq-changefeed") { [self] in round() }
    }

    /// The next poll first brings in what `importer`'s listing of the store holds that this
    /// device has no record of (`Importer.runLive`), while the file system answers: a mount
    /// again waits for a listing of the whole store (a million objects on S3: 15 s) 2 s at most
    /// (`waitForAPoll`), and a mount whose first listing failed does not go without one. A poll that fails part way
    /// (the store down) brings it in again; `ubiq sync` waits for it. Call before `start`.
    public func importFirst(_ importer: Importer) {
        pollLock.withLock { self.importer = importer }
        let new = !Importer.importedBefore(state)
        cond.lock(); listingPending = true; bringingTheRest = new; cond.unlock()
    }

    /// How long a lookup of a name not here waits at most for the listing that brings in a
    /// new device's rest (`waitForTheListing`); past it the name is not found, as before.
    public static let listingWait: TimeInterval = 120

    /// Whether this device, new to the store, is bringing in the rest of it (its mount answers
    /// before a large store's rest is in: `Importer.beforeMount`), so that a name not here may
    /// be in the store still. Not while that listing fails (the store down: a name not here is
    /// not found, at once), nor on a mount again (the device has the whole store as it last saw
    /// it; what is new there comes in as changes).
    public var fillingIn: Bool {
        cond.lock(); defer { cond.unlock() }
        return bringingTheRest && listingPending && !listingHalted
    }

    /// Whether `key` (a store key's bytes, without a folder's `/`) may name an object that
    /// listing has not brought in yet: a name looked up meanwhile is not "not there" until the
    /// listing has passed it.
    public func mayStillBring(_ key: [UInt8]) -> Bool {
        cond.lock(); defer { cond.unlock() }
        return stillBringing(key)
    }

    /// Waits up to `seconds` until `mayStillBring(key)` is false.
    public func waitForTheListing(toBring key: [UInt8], seconds: TimeInterval) {
        let deadline = Deadline(in: seconds)
        cond.lock(); defer { cond.unlock() }
        while stillBringing(key) {
            if !deadline.wait(cond) { return }
        }
    }

    /// Under `cond`. The listing goes in key order: past `key + "0"` it is past `key` and every
    /// key under it as a folder (`key/…`: "/" comes just before "0").
    private func stillBringing(_ key: [UInt8]) -> Bool {
        bringingTheRest && listingPending && !listingHalted && listedThrough.lexicographicallyPrecedes(key + [UInt8(ascii: "0")])
    }

    /// The listing has brought in every key up to `key`.
    private func listed(through key: String) {
        let bytes = Array(key.utf8)
        cond.lock()
        if listedThrough.lexicographicallyPrecedes(bytes) { listedThrough = bytes; cond.broadcast() }
        cond.unlock()
    }

    /// What the feed last saw of the store, as the mount's root attributes say it
    /// (`user.ubiq.store-reached`, `store-error`, `store-listing`; `ubiq status`).
    public struct Look: Sendable, Equatable {
        /// When a poll last reached the store and took its changes (nil: not since the mount).
        public var reached: Date?
        /// Why the last poll failed (nil: it did not, or none has ended).
        public var error: String?
        /// The listing of the whole store that a mount again's first poll takes is not over.
        public var listing: Bool
        /// When the last poll ended, whether it reached the store or not (nil: none has).
        public var polled: Date?

        public init(reached: Date? = nil, error: String? = nil, listing: Bool = false, polled: Date? = nil) {
            self.reached = reached; self.error = error; self.listing = listing; self.polled = polled
        }
    }

    /// Whether the store answers now: one question of a key no one writes (`ubiq sync` asks
    /// before it waits for uploads, when the last poll could not reach the store: a poll of a
    /// store that is down takes its requests' retries many times over, 15 s and more).
    public func storeAnswers() -> Bool {
        let store = self.store
        do { _ = try runBlocking { try await store.head(Self.probeKey) } } catch let e as StoreError where e.isTransient {
            return false
        } catch {}
        return true
    }

    static let probeKey = ReservedKeys.root + "reachable"

    public var look: Look {
        cond.lock(); defer { cond.unlock() }
        return Look(reached: lastReached, error: lastPoll?.error, listing: listingPending, polled: lastPoll?.at)
    }

    public func stop() {
        cond.lock(); listingHalted = true; cond.broadcast(); cond.unlock()
        loop.stop()
    }

    /// The polling thread waits for its next round (a test that moves the clock waits for this).
    var isIdle: Bool { loop.isIdle }

    /// Poll now rather than at the next interval; `everywhere`: a poll that also finds what
    /// changed in the store without its feed knowing (another tool's objects in a bucket).
    public func kick(everywhere: Bool = false) {
        if everywhere { store.lookEverywhereNext() }
        cond.lock(); loop.kickLocked(wake: true); cond.unlock()
    }

    /// Runs `look` after each poll from now on, reached or not, until it says it is done, and
    /// at the latest `seconds` on by the clock (`look(true)`: the last); polls come every
    /// quarter second meanwhile, the first at once, and one `everywhereAfter` seconds on also
    /// lists everything (`PollWaits`).
    public func afterEachPoll(for seconds: TimeInterval, everywhereAfter: TimeInterval,
                              _ look: @escaping @Sendable (_ last: Bool) -> Bool) {
        let now = state.time.now
        waits.add(until: now.addingTimeInterval(seconds), everywhereAt: now.addingTimeInterval(everywhereAfter), look)
        kick(everywhere: everywhereAfter <= 0)
    }

    /// Waits up to `seconds` (real time) for a poll to end, reaching the store or not; whether
    /// one did. A mount again waits so for its first (`importFirst`): a store that answers in
    /// time is shown as it is now, as before; a larger one (a million objects: 17 s) answers with
    /// what the device knew, and the poll goes on.
    public func waitForAPoll(seconds: TimeInterval) -> Bool {
        let deadline = Deadline(in: seconds)
        cond.lock(); defer { cond.unlock() }
        while lastPoll == nil {
            if !deadline.wait(cond) { return lastPoll != nil }
        }
        return true
    }

    /// One turn of the polling thread: a poll, then a wait for the next (or a kick).
    private func round() -> BackgroundLoop.Pause {
        do {
            try poll()
            failures = 0
        } catch is CancellationError where loop.isStopping {
            return .none  // an unmount ended a poll that waited on the store: the next start reads it again
        } catch {
            failures += 1
            if failures == 1 || failures % 20 == 0 { logger.warning("could not follow the store's changes: \(error)") }
        }
        // A store that is down is asked less often (up to a minute apart); while something waits
        // for the next changes, every quarter second.
        let pause = failures == 0 ? interval : SyncRetries.feed(interval: interval).pause(afterFailures: failures)
        return BackgroundLoop.Pause(upTo: waits.isEmpty ? pause : min(pause, PollWaits.pace))
    }

    /// Reads every change since the saved cursor and applies it. Returns the number of
    /// keys handed to the applier. Throws when the store cannot be reached (nothing is lost:
    /// the cursor stays where it was).
    @discardableResult
    public func poll(everywhere: Bool = false) throws -> Int {
        // Paused by the user: other devices' changes wait (`SyncPause`).
        if pause?.isPaused == true { return 0 }
        // (After the lock is given up: what waited for this poll may start reads.)
        defer { if waits.lookAll() { store.lookEverywhereNext() } }
        pollLock.lock(); defer { pollLock.unlock() }
        if everywhere { store.lookEverywhereNext() }
        do {
            let n = try pollLocked()
            cond.lock(); lastPoll = (state.time.now, nil); lastReached = lastPoll?.at; cond.broadcast(); cond.unlock()
            changes.storeAnswered()
            return n
        } catch {
            cond.lock(); lastPoll = (state.time.now, "\(error)"); cond.broadcast(); cond.unlock()
            throw error
        }
    }

    private func pollLocked() throws -> Int {
        // Everything this poll asks of the store is asked from here on: a key this device
        // writes meanwhile is not taken from the answers (`StoreWrites`).
        let question = writes.asked()
        defer { writes.done(question) }
        let stamped = { (changes: [RemoteChange]) -> [RemoteChange] in
            changes.map { var c = $0; c.askedAt = question.at; return c }
        }
        if let importer { try bringInTheListing(importer, stamped) }
        var round = try readTheFeed()
        if !round.reconcile && !round.told.isEmpty { try passOverOwnChanges(&round) }
        if round.reconcile { try compareEverything(&round) }
        let found = try described(&round)
        let (count, applied) = hand(found.changes, asked: &round.seen, stamped)
        let retry = Set((applied + found.unread).map(KeyBytes.init)).map(\.key)
        keyValues?.apply(objectKeys: found.kvKeys, initial: round.reconcile)  // also when none changed: it sends what waits
        let (newCursor, pending) = (round.cursor, round.pending)
        try state.write { tx in
            if let newCursor { try tx.setMeta(Self.cursorKey, newCursor) }
            if !(pending.isEmpty && retry.isEmpty) { try tx.setFeedPending(retry) }
        }
        return count
    }

    /// Hands `found` to the file system as one batch, with what it implies: the deletes of
    /// moves made elsewhere that have not reached this device yet, and the moves paired
    /// (`RemoteMoves`). Returns how many changes went, and the keys to try again.
    private func hand(_ found: [RemoteChange], asked: inout Set<KeyBytes>,
                      _ stamped: ([RemoteChange]) -> [RemoteChange]) -> (count: Int, retry: [String]) {
        guard !found.isEmpty else { return (0, []) }
        var batch = RemoteBatch([])
        do {
            let all = found + (try RemoteMoves.deletesImplied(by: found, state: state, store: store, asked: &asked))
            batch = RemoteBatch(stamped(all))
            try changes.commitPendingCreates()
            batch.moves = try RemoteMoves.pair(batch, in: state)
        } catch {
            logger.warning("remote changes wait: \(error)")
            return (batch.changes.count, batch.changes.isEmpty ? found.map(\.key) : batch.changes.map(\.key))
        }
        return (batch.changes.count, changes.applyRemote(batch))
    }

    /// What one poll has learned so far, handed from step to step. Keys as bytes throughout:
    /// NFC and NFD spellings of one name are two keys.
    private struct Round {
        var cursor: String?
        /// Keys an earlier poll could not finish, asked again first.
        let pending: [String]
        /// Every key to look at, in the order the feed told them.
        var order: [String]
        var seen: Set<KeyBytes>
        /// What the store holds at a key, where it is known without a HEAD (nil inside: absent).
        var known: [KeyBytes: ObjectInfo?] = [:]
        /// The feed's changes of keys it has once (the others are asked for whatever they say).
        var told: [KeyBytes: StoreChange] = [:]
        /// A full comparison with the store instead of the feed's changes.
        var reconcile = false
        /// What this device had recorded of each key before the store is asked (see RemoteChange).
        var before: [KeyBytes: String] = [:]
        /// Changes this device has already: its own puts, as the store's feed says (their
        /// origin), and what it records as the feed tells it. The uploader recorded them.
        var own = Set<KeyBytes>()
        /// What this device recorded of the keys asked of `store.confirmed`, read before it.
        var recorded: [KeyBytes: String?] = [:]
    }

    /// The importer's listing, before the cursor's changes: the cursor is from before this
    /// listing, so whatever changed meanwhile comes after what the listing showed (a delete
    /// after a put).
    private func bringInTheListing(_ importer: Importer, _ stamped: @escaping ([RemoteChange]) -> [RemoteChange]) throws {
        var retry: [String] = []
        var handed = 0
        let stopping = loop.isStopping
        cond.lock(); listingHalted = stopping; listedThrough = []; cond.unlock()
        do {
            try importer.runLive(stopping: { [loop] in loop.isStopping }, listed: { [self] in listed(through: $0) }) { [self] page in
                var asked = Set(page.map { KeyBytes($0.key) })
                let (count, again) = hand(page, asked: &asked, stamped)
                handed += count
                retry += again
            }
        } catch {
            cond.lock(); listingHalted = true; cond.broadcast(); cond.unlock()
            throw error
        }
        self.importer = nil
        cond.lock(); listingPending = false; bringingTheRest = false; cond.broadcast(); cond.unlock()
        if handed > 0 { logger.info("brought in \(handed) changes from the store's listing that this device had not heard of") }
        if !retry.isEmpty {
            try state.write { tx in try tx.setFeedPending(Set((try tx.feedPending() + retry).map(KeyBytes.init)).map(\.key)) }
        }
    }

    /// The keys to look at: those an earlier poll left, then the feed's changes since the
    /// saved cursor; or, with no cursor or one the store cannot answer from, a full comparison.
    private func readTheFeed() throws -> Round {
        let store = self.store
        let pending = try state.read { try $0.feedPending() }
        var round = Round(cursor: try state.read { try $0.meta(Self.cursorKey) }, pending: pending,
                          order: pending, seen: Set(pending.map(KeyBytes.init)))
        // What this device recorded of each key when a full comparison began is held aside
        // before the store is listed (`holdRecordedVersions`). A listing is not one moment (S3
        // pages through the bucket, and its store hands back the listing the new cursor was
        // found with), and uploads go on meanwhile: a key recorded after the listing began is not
        // a key the listing missed.
        if round.cursor == nil {
            // No cursor (the store was down at mount): start from now, and compare everything.
            try holdRecordedVersions()
            round.cursor = try retryingTransient { try runBlocking { try await store.currentCursor() } }
            round.reconcile = true
        }
        while !round.reconcile {
            let since = round.cursor
            let size = batchSize
            // Ended by an unmount (a full listing of a million objects takes 1,000 requests).
            let batch = try retryingTransient {
                try runBlocking(stopping: { [loop] in loop.isStopping }) { try await store.changes(since: since, limit: size) }
            }
            if batch.reset {
                logger.notice("the store cannot answer from this device's place in its changes (restored from a backup, or its history cut short): comparing everything with it; changes of this device not yet uploaded are kept")
                try holdRecordedVersions()
                round.cursor = try runBlocking { try await store.currentCursor() }
                round.reconcile = true
                break
            }
            for c in batch.changes {
                if round.seen.insert(KeyBytes(c.key)).inserted {
                    round.order.append(c.key)
                    round.told[KeyBytes(c.key)] = c
                } else {
                    round.told[KeyBytes(c.key)] = nil
                }
            }
            for what in batch.unreadable { logger.warning("passing over a change the store holds but cannot be read: \(what)") }
            round.cursor = batch.cursor
            if !batch.more { break }
        }
        return round
    }

    /// Of the feed's changes, those this device has already (its own, as their origin or the
    /// version it records says) are passed over; what the store can tell at once of the
    /// others is known without a HEAD.
    private func passOverOwnChanges(_ round: inout Round) throws {
        let once = round.order.compactMap { round.told[KeyBytes($0)] }.filter { !ReservedKeys.isReserved($0.key) }
        // Files only: a store may keep no metadata on a folder's marker (SeaweedFS), so its
        // HEAD shows no origin and the change goes on to the file system, as it must.
        for c in once where !c.key.hasSuffix("/") && writtenHere(c.claimed?.metadata) {
            round.own.insert(KeyBytes(c.key))
        }
        // Each key's recorded version is read once: a key the store does not tell of keeps
        // this read for its HEAD below (still read before the store was asked).
        let others = once.filter { !round.own.contains(KeyBytes($0.key)) }
        try state.read { tx in
            for c in others {
                let entry = try tx.entries(remoteKey: c.key).first
                round.recorded[KeyBytes(c.key)] = .some(entry?.remoteVersion)
                // Nothing to ask of a change of a file this device has already: the version it
                // records (its own put on a store whose feed tells no origin), or a delete of a
                // key it has no item for (its own delete). A later change of the key comes
                // later in the feed (two of one key in one look are asked of the store, below).
                // Folders' markers are asked, as for the origin: on a store that keeps no
                // metadata on them (SeaweedFS) a marker's version is its ETag alone, the same
                // for every empty marker, and says nothing of which one it is.
                if c.key.hasSuffix("/") { continue }
                if c.kind == .put ? (c.version != nil && entry?.remoteVersion == c.version) : entry == nil {
                    round.own.insert(KeyBytes(c.key))
                }
            }
        }
        // What the store can tell at once of the others (the S3 store: a listing for a folder
        // of many), asked after what this device recorded of them is read, as a HEAD is.
        let ask = others.filter { !round.own.contains(KeyBytes($0.key)) }
        let answers = ask.isEmpty ? [] : (try? runBlocking { [store] in await store.confirmed(ask) }) ?? []
        for c in answers.count == ask.count ? answers : [] {
            switch c.current {
            case .object(let info): round.known[KeyBytes(c.key)] = info
            case .absent: round.known[KeyBytes(c.key)] = .some(nil)
            case nil: continue
            }
            if let v = round.recorded[KeyBytes(c.key)] ?? nil { round.before[KeyBytes(c.key)] = v }
        }
    }

    /// A full comparison: every key whose store object differs from what this device recorded
    /// (held aside when the comparison began) joins the round, with what the store holds.
    private func compareEverything(_ round: inout Round) throws {
        defer {
            try? state.write { try $0.releaseHeldVersions() }
            holding = false
        }
        let differing = try differencesFromTheStore(alsoOf: round.seen)
        for c in differing {
            round.known[KeyBytes(c.key)] = c.info
            if let v = c.recordedBefore { round.before[KeyBytes(c.key)] = v }
            if round.seen.insert(KeyBytes(c.key)).inserted { round.order.append(c.key) }
        }
    }

    /// The round's keys as changes for the file system, each with what the store holds now
    /// (a HEAD where it is not known yet); the key-value store's keys; and the keys that wait
    /// for the next poll (the store could not tell of them).
    private func described(_ round: inout Round) throws -> (changes: [RemoteChange], kvKeys: [String], unread: [String]) {
        let store = self.store
        var changes: [RemoteChange] = []
        var kvKeys: [String] = []
        var unread: [String] = []
        // A key new here that the store failed to tell of this poll (see below).
        var unreadNewKey = false
        for key in round.order {
            // ubiq's own keys are not files: the key-value store's go to its handler.
            if ReservedKeys.isReserved(key) {
                if key.hasPrefix(ReservedKeys.kv) { kvKeys.append(key) }
                continue
            }
            let info: ObjectInfo?
            if round.own.contains(KeyBytes(key)) { continue }
            if let k = round.known[KeyBytes(key)] {
                info = k
            } else {
                let v = try round.recorded[KeyBytes(key)] ?? state.read({ try $0.entries(remoteKey: key).first?.remoteVersion })
                if let v { round.before[KeyBytes(key)] = v }
                do { info = try retryingTransient { try runBlocking { try await store.head(key) } } } catch StoreError.notFound {
                    info = nil
                } catch StoreError.invalidKey(_, let why) {
                    warnOnce(key, "skipping store key \(key.debugDescription): \(why)")
                    continue
                } catch let e as StoreError where e.isTransient {
                    // This key waits for the next poll; the others go on (a flaky store must
                    // not stall the whole feed on one of a thousand keys).
                    unread.append(key)
                    if v == nil { unreadNewKey = true }
                    continue
                } catch {
                    // An answer this device cannot use: asked again at the next poll, said once,
                    // and no other key waits for it.
                    warnOnce(key, "cannot read \(key.debugDescription) from the store (asked again at each poll): \(error)")
                    unread.append(key)
                    continue
                }
            }
            if let info, let w = info.inputWarning {
                warnOnce(key + "\u{0}" + info.version, w.message)
                if w.leftOut { continue }
            }
            // This device's own writes: the uploader records them.
            if writtenHere(info?.metadata) { continue }
            changes.append(RemoteChange(key: key, info: info, recordedBefore: round.before[KeyBytes(key)]))
        }
        // A new key that could not be read may be where an item went: another device copies it
        // there, then deletes the old key. Applied without it, the delete removes the item here
        // and the copy comes next poll as a new one: its bytes are downloaded again, its pins and
        // the inode open files hold are lost. So this poll's deletes of what this device holds
        // wait with it, and go together with it next poll. (A key the store cannot answer for
        // at all holds nothing up.)
        if unreadNewKey {
            let held = { (c: RemoteChange) in c.info == nil && c.recordedBefore != nil }
            unread += changes.filter(held).map(\.key)
            changes.removeAll(where: held)
        }
        return (changes, kvKeys, unread)
    }

    /// Objects taken from the store's listing at a time in a full comparison (tests set fewer).
    var comparisonPage = 10_000
    /// Whether what this device recorded is held aside for a full comparison (under `pollLock`).
    private var holding = false

    /// Sets what this device records aside for a full comparison, unless a poll that failed
    /// since (the store down) did: still from before the listing to come, and a million rows
    /// are not copied again at every poll while the store is down.
    private func holdRecordedVersions() throws {
        if holding { return }
        try state.write { try $0.holdRecordedVersions() }
        holding = true
    }

    /// A full comparison of the store with what this device recorded before it was listed (held
    /// aside by `holdRecordedVersions`): each listed object whose version is not the one recorded
    /// for its key (or whose key is among `keys`, the feed's pending ones), then each key
    /// recorded that the listing lacks, as gone. The listing is taken a page at a time and weighed
    /// against the held versions page by page, so that what is held at once is a page and the
    /// differences: a million objects' listing and versions held together were a GB. (Keys at the
    /// version recorded are no change: applying one is a no-op.)
    private func differencesFromTheStore(alsoOf keys: Set<KeyBytes>) throws -> [RemoteChange] {
        let store = self.store, state = self.state, comparisonPage = self.comparisonPage
        let found = UncheckedBox([RemoteChange]())
        let page = UncheckedBox { (objects: [ObjectInfo]) in
            let held = try state.write { try $0.markListed(objects.map(\.key)) }
            for (o, v) in zip(objects, held) where v != o.version || keys.contains(KeyBytes(o.key)) {
                found.value.append(RemoteChange(key: o.key, info: o, recordedBefore: v))
            }
        }
        try retryingTransient {
            found.value = []
            try state.write { try $0.unmarkListed() }
            try runBlocking(stopping: { [loop] in loop.isStopping }) {
                try await store.list(prefix: "", pagesOf: comparisonPage) { try page.value($0) }
            }
        }
        // Recorded before the listing began, and not in it: gone from the store.
        for (k, v) in try state.read({ try $0.heldUnlisted() }) {
            found.value.append(RemoteChange(key: k, info: nil, recordedBefore: v))
        }
        return found.value
    }

    /// Whether metadata says this device wrote it (its origin tag).
    private func writtenHere(_ metadata: ObjectMetadata?) -> Bool {
        metadata?.origin?.hasPrefix(deviceID + ":") == true
    }

    /// Logs `message` the first time `what` comes up (call under `pollLock`).
    private func warnOnce(_ what: String, _ message: String) {
        if warned.count > 10_000 { warned.removeAll() }
        if warned.insert(KeyBytes(what)).inserted { logger.warning("\(message)") }
    }
}
