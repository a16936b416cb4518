import Foundation
import UbiqClock
import Logging
import UbiqStore

/// Where a store is in S3: `s3://BUCKET/PREFIX`.
public struct S3Location: Sendable, Equatable {
    public var bucket: String
    public var prefix: String

    /// Parses `s3://BUCKET[/PREFIX]`; a clear error for anything else.
    public init(_ url: String) throws {
        guard url.hasPrefix("s3://") else { throw StoreError.failed("\(url) is not an s3://BUCKET/PREFIX address") }
        let rest = url.dropFirst(5)
        let bucket = String(rest.prefix { $0 != "/" })
        let valid = bucket.count >= 3 && bucket.count <= 63
            && bucket.allSatisfy { $0.isASCII && ($0.isLowercase || $0.isNumber || $0 == "-" || $0 == ".") }
            && bucket.first!.isLetterOrNumber && bucket.last!.isLetterOrNumber
        guard valid else {
            throw StoreError.failed("\(bucket.debugDescription) is not a bucket name: 3 to 63 lowercase letters, digits, dots and hyphens")
        }
        var prefix = String(rest.dropFirst(bucket.count)).trimmingCharacters(in: CharacterSet(charactersIn: "/"))
        if !prefix.isEmpty {
            do { try StoreKey.validate(prefix) } catch { throw StoreError.failed("the prefix in \(url) is not a valid folder path") }
            prefix += "/"
        }
        self.bucket = bucket; self.prefix = prefix
    }
}

extension Character {
    fileprivate var isLetterOrNumber: Bool { isLetter || isNumber }
}

/// The store in an S3-compatible bucket (AWS S3, Ceph RGW, SeaweedFS, MinIO, Garage).
///
/// There is no change feed in S3. Devices write what they change to a change log in the
/// bucket (`ChangeLog`), and a poll reads what is new there: one LIST request when nothing
/// changed, whatever the bucket's size. Changes the log does not have (other tools' objects, a
/// log object lost) are found by listing the prefix and comparing with the last listing (ETag,
/// time and size of each key), kept in a small SQLite index beside the device's state: at
/// mount, every `fullListingInterval`, and when asked (`lookEverywhereNext`, `ubiq sync`).
/// A listing costs one LIST request per 1,000 objects, plus one HEAD for each object that
/// changed. The index also remembers each object's metadata, so a listing at mount sends a
/// HEAD only for objects new or changed since the last.
public final class S3Store: CloudStore, @unchecked Sendable {
    public let objects: S3Objects
    /// This device's time (`S3Objects.time`).
    var time: any TimeSource { objects.time }
    let index: S3Index
    let log: ChangeLog
    /// The deletes of moves whose log object is not written yet.
    let deletes: S3DeferredDeletes
    let logger: Logger
    /// Seconds between full listings of the bucket (the change log is read at every poll).
    public let fullListingInterval: TimeInterval
    /// How long log objects are kept: well past a full listing, which covers older changes.
    var logRetention: TimeInterval { max(3600, 2 * fullListingInterval + ChangeLog.window) }
    private let lock = NSLock()
    private var warned = Set<[UInt8]>()
    private var lastFullListing: Date?
    private var fullListingAsked = false
    /// HEAD requests the last `list` sent (the rest it knew from the index).
    public private(set) var headsForLastListing = 0
    /// Requests the last `changes(since:)` sent (the log's, or the full listing's), and
    /// whether it listed the whole bucket.
    public private(set) var lastLook: (requests: Int, full: Bool) = (0, false)
    /// HEAD requests sent at once when a listing needs metadata.
    static let headsInFlight = 16
    /// Listed objects looked up at a time (`describe`; tests make it small).
    var describePage = 10_000
    /// Keys a LIST of the whole bucket asks for at a time (S3's most; tests ask for fewer).
    var listingPageSize = 1000
    /// HEADs a listing needed that make the next full listing write a snapshot (or a
    /// twentieth of the bucket, if more).
    var headsWorthASnapshot = 1000
    /// Seconds between snapshots of the bucket.
    public let snapshotInterval: TimeInterval
    let snapshots: S3Snapshots
    /// When the latest snapshot this device knows of was written, by this device's clock
    /// (distantPast: there is none) and by the server's (ms; 0: none); nil: not looked yet.
    private var latestSnapshot: (at: Date, time: Int64)?
    private var snapshotWanted = false
    private let snapshotJitter = Double.random(in: 1 ... 1.25)
    /// The last full listing for a moment after it was taken, until this device writes
    /// (`list` takes it once).
    private var recentListing: (listing: Listing, at: Date)?
    /// The first listing of the whole bucket in this run when a list asked for it (a mount
    /// again: the importer's), with the log's objects marked just before it: the feed's first
    /// full listing, due at once, takes it rather than listing the bucket again (`listEverything`).
    private var premarked: (listing: Listing, marked: ChangeLog.Read, at: Date)?
    /// Snapshot loads, one at a time (`loadLatestSnapshot`).
    private let snapshotLoads = AsyncGate()
    /// How long a premarked listing waits for the feed's first full listing.
    static let premarkedFor: TimeInterval = 120
    /// The feed's last listing was a fresh device's first part (`startingCursor`): the next is
    /// its first full one.
    private var firstPartOnly = false
    /// Where each change of the last look at the log came from (`confirmed` takes them).
    private var lastNotes: [KeyBytes: ChangeLog.Note] = [:]

    init(objects: S3Objects, index: S3Index, logger: Logger, fullListingInterval: TimeInterval, snapshotInterval: TimeInterval) {
        self.objects = objects; self.index = index; self.logger = logger
        self.fullListingInterval = fullListingInterval; self.snapshotInterval = snapshotInterval
        log = ChangeLog(objects: objects, reserved: S3Objects.reserved, device: index.id, seal: objects.seal, time: objects.time, logged: { [index] in index.logged($0) })
        let deletes = S3DeferredDeletes(objects: objects, index: index)
        self.deletes = deletes
        log.settleDeletes = { try await deletes.settleForLog($0, ahead: $1) }
        snapshots = S3Snapshots(objects: objects)
        // A wish a run before this one made and did not meet (see `describe`).
        snapshotWanted = (try? index.setting(Self.snapshotWish)) == "1"
        firstPartOnly = (try? index.setting(S3Index.firstPartSetting)) != nil
        // Writes of the last run that no log object names (it ended between a write and its
        // log object): their entries go out with this run's first.
        // A move's delete that waited is made before its entry goes (see `delete`).
        var waiting = deletes.waitingKeys
        for w in index.unlogged() {
            log.record(.init(op: w.op, key: w.key, version: nil, row: w.id, deferred: waiting.remove(w.key) != nil))
        }
        for key in waiting.sorted() { log.record(.init(op: "delete", key: key, version: nil, deferred: true)) }
    }

    /// Opens the store at `location` through `endpoint`: makes the bucket if it is missing,
    /// learns whether it keeps versions and whether the server honours conditional writes
    /// (one probe object, removed at once), and aborts part uploads a crash left over a day ago.
    public static func open(_ location: S3Location, endpoint: URL, region: String, credentials: S3Credentials,
                            indexPath: String, logger: Logger, multipartThreshold: Int64 = 64 << 20,
                            fullListingInterval: TimeInterval = 300, snapshotInterval: TimeInterval = 86_400) async throws -> S3Store {
        let client = S3Client(endpoint: S3Endpoint(url: endpoint, region: region, bucket: location.bucket, credentials: credentials),
                              logger: logger)
        let index = try S3Index(path: indexPath)
        var versioned: Bool, conditions: Bool, folders: Bool
        var online = true
        do {
            try await client.ensureBucket()
            versioned = try await client.bucketKeepsVersions()
            let probe = S3Objects(client: client, prefix: location.prefix, versioned: versioned)
            conditions = try await probe.serverChecksConditions()
            folders = try await probe.serverKeepsFolderMetadata()
            try index.setSetting("versioned", versioned ? "1" : "0")
            try index.setSetting("conditions", conditions ? "1" : "0")
            try index.setSetting("folder_metadata", folders ? "1" : "0")
        } catch let e as StoreError where e.isTransient {
            // Down: a device that knew this bucket works on with what it knew (and syncs when it
            // is back); one that never reached it cannot start.
            guard let v = try index.setting("versioned"), let c = try index.setting("conditions") else { throw e }
            logger.warning("cannot reach the S3 store (\(e)); working with what this device knew")
            versioned = v == "1"; conditions = c == "1"; online = false
            folders = try index.setting("folder_metadata") != "0"
        }
        if !folders {
            logger.warning("this S3 server keeps no metadata on folder markers: folders' modes, owners, times and xattrs stay on the device that set them (files' are synced)")
        }
        if !conditions {
            logger.warning("this S3 server ignores If-None-Match/If-Match on writes: ubiq checks the current version before each write instead, which leaves a short window where two devices' writes can race unseen")
        }
        let objects = S3Objects(client: client, prefix: location.prefix, versioned: versioned, checksConditions: conditions,
                                multipartThreshold: multipartThreshold, journal: index, keepsFolderMetadata: folders)
        if online, let n = try? await objects.abortStaleUploads(), n > 0 { logger.info("aborted \(n) part uploads left over a day ago") }
        logger.info("S3 store s3://\(location.bucket)/\(location.prefix) at \(endpoint.absoluteString): \(versioned ? "versioned bucket (history kept)" : "bucket without versioning (no history)"), \(credentials)")
        return S3Store(objects: objects, index: index, logger: logger, fullListingInterval: fullListingInterval,
                       snapshotInterval: snapshotInterval)
    }

    /// Logs each key that cannot be shown, once.
    private func warn(_ skipped: [SkippedKey]) {
        lock.lock()
        let fresh = skipped.filter { warned.insert($0.raw).inserted }
        lock.unlock()
        for s in fresh { logger.warning("skipping store key \(s.shown): \(s.reason)") }
    }

    // MARK: - CloudStore

    /// The current version of `key`. SeaweedFS (a server that keeps no folder metadata: it
    /// keeps folders as its own directories) answers a HEAD of `a/` for any directory it has,
    /// marker or not, and keeps the directory of a folder whose marker was deleted while it held
    /// something (a folder moved elsewhere: the marker goes first). A folder the log says was
    /// deleted is there only if a listing shows its marker; else the moved folder would come
    /// back on every device that reads the log.
    public func head(_ key: String) async throws -> ObjectInfo {
        try await deletes.settle(key)
        let info = try await objects.head(key)
        // On a server that keeps folders as directories of its own (and drops their metadata),
        // a marker is where a listing shows that very key: a HEAD answers for a directory with
        // no marker, or a file of the folder's name, too (`S3Objects.mayBeMarker`). One LIST.
        guard key.hasSuffix("/"), !objects.keepsFolderMetadata else { return info }
        if try await !objects.listsMarker(key) { throw StoreError.notFound(key: key) }
        return info
    }

    public func list(prefix: String) async throws -> [ObjectInfo] {
        var all: [ObjectInfo] = []
        try await list(prefix: prefix, pagesOf: describePage, wanted: { $0.map { _ in true } }) { all += $0 }
        return all
    }

    /// Each page described as it is found: what is held at once is the listing's records and
    /// one page of metadata (a million objects' `ObjectInfo`s together were most of a mount's
    /// peak).
    public func list(prefix: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
                     _ body: ([ObjectInfo]) throws -> Void) async throws {
        let listing = try await listing(prefix)
        try await describe(listing, counted: true, pagesOf: min(max(1, size), describePage), wanted: wanted) { page in
            try body(deletes.leavingOutWaiting(page.map(\.1)))
        }
        // A fresh device's first part (`startingCursor`): handed on, and said to be only that.
        if listing.through != nil { throw ListingCutShort() }
    }

    /// The listing of `prefix`: the whole bucket's just after a full listing (a fresh mount:
    /// the feed's first look, then the importer's) is that listing, rather than another.
    private func listing(_ prefix: String) async throws -> Listing {
        let recent = prefix.isEmpty ? lock.withLock { () -> Listing? in
            defer { recentListing = nil }
            return recentListing.flatMap { time.now.timeIntervalSince($0.at) < 10 ? $0.listing : nil }
        } : nil
        if let recent { return recent }
        // The first listing of the bucket in this run, before any full listing of the feed's:
        // the log's objects are marked first, as a full listing's are, so that the feed's first
        // one can be this (a mount again listed the bucket twice, the second time at once).
        if prefix.isEmpty, lock.withLock({ lastFullListing == nil && premarked == nil }) {
            let marked = try await lookSinceLastRun()
            // The rest of a snapshot whose first parts a fresh device read is read meanwhile.
            let inPart = snapshotReadInPart
            async let rest = inPart ? loadLatestSnapshot() : false
            let listing: Listing
            do { listing = try await objects.listAll(under: "", pageSize: listingPageSize) } catch {
                _ = await rest
                throw error
            }
            _ = await rest
            warn(listing.skipped)
            let at = time.now
            lock.withLock { premarked = (listing, marked, at) }
            // Kept for the feed's first full listing whatever its wait, after a first part: a
            // listing taken anew would tell every key past that part (millions of changes).
            later(Self.premarkedFor) { if $0.premarked?.at == at, !$0.firstPartOnly { $0.premarked = nil } }
            return listing
        }
        let listing = try await objects.listAll(under: prefix)
        warn(listing.skipped)
        return listing
    }

    /// Each listed object with its metadata: what the index knows of it at the listed stamp,
    /// else what the bucket's latest snapshot says (read when many are unknown), else a HEAD.
    /// Objects gone meanwhile are left out. `counted`: the HEADs sent are `headsForLastListing`.
    /// Taken `page` objects at a time, each page handed to `each` in listing order, so that
    /// what is looked up is held for a page only (a whole bucket's at once was most of a
    /// mount's peak memory: 130 MiB at 100,000). Only the objects `wanted` keeps are looked up
    /// (a page it keeps none of is not handed on).
    private func describe(_ listing: Listing, counted: Bool, pagesOf page: Int,
                          wanted: ([String]) throws -> [Bool] = { $0.map { _ in true } },
                          _ each: ([(ListedObject, ObjectInfo)]) async throws -> Void) async throws {
        let all = listing.objects
        var unknown = try index.unknownCount(all)
        if unknown >= max(1, all.count / 10), await loadLatestSnapshot(through: listing.through) { unknown = try index.unknownCount(all) }
        // A new device would send as many HEADs: the next full listing writes a snapshot. The
        // wish is kept in the index, so that a restart before that listing (minutes away) does
        // not leave every new device to HEADs for the day until the next one.
        if unknown >= snapshotWorth(all.count),
           lock.withLock({ () -> Bool in defer { snapshotWanted = true }; return !snapshotWanted }) {
            try? index.setSetting(Self.snapshotWish, "1")
        }
        let objects = self.objects, index = self.index
        var heads = 0
        // The next page's objects, and the index's lookup of them, started while this page is
        // handed on: the index and what `each` writes to are two databases, and a fresh
        // device's mount did one after the other for every page (100,000 objects: 40% of its
        // pages' time was the lookup).
        var start = 0
        func nextPage() throws -> (chunk: [ListedObject], lookup: Task<[KeyBytes: ObjectInfo], any Error>)? {
            while start < all.count {
                let listed = all[start ..< min(all.count, start + page)]
                start += page
                let chunk = zip(listed, try wanted(listed.map(\.key))).filter(\.1).map(\.0)
                if !chunk.isEmpty { return (chunk, Task { try index.known(chunk) }) }
            }
            return nil
        }
        var upcoming = try nextPage()
        while let (chunk, lookup) = upcoming {
            var found = try await lookup.value
            // What the log said another device's put wrote, where the listing bears it out, is
            // that object: no HEAD.
            var learned = try claimsBorneOut(chunk, known: found, in: listing)
            for (_, claim) in learned { found[KeyBytes(claim.key)] = claim }
            let need = chunk.filter { found[KeyBytes($0.key)] == nil }
            heads += need.count
            try await withThrowingTaskGroup(of: (ListedObject, ObjectInfo?).self) { group in
                var next = 0
                func add() {
                    guard next < need.count else { return }
                    let o = need[next]
                    next += 1
                    group.addTask {
                        do { return (o, try await objects.head(o.key)) } catch StoreError.notFound { return (o, nil) }  // gone meanwhile
                    }
                }
                for _ in 0 ..< Self.headsInFlight { add() }
                while let (o, info) = try await group.next() {
                    add()
                    guard let info else { continue }
                    found[KeyBytes(o.key)] = info
                    if Self.settled(o, info, in: listing, within: settleWindow) { learned.append((o.stamp, info)) }
                }
            }
            try index.remember(learned)
            let described = chunk.compactMap { o in found[KeyBytes(o.key)].map { (o, $0) } }
            upcoming = try nextPage()
            if !described.isEmpty { try await each(described) }
        }
        if counted { lock.withLock { headsForLastListing = heads } }
    }

    /// Whether `info` is surely `o` as listed, and settled (see S3Index.advance): what the
    /// index and snapshots remember.
    static func settled(_ o: ListedObject, _ info: ObjectInfo, in listing: Listing, within window: TimeInterval = unsettled) -> Bool {
        guard info.contentTag == o.etag, let m = o.modified else { return false }
        return listing.taken.timeIntervalSince(m) >= window
    }

    /// How long after an object's listed time it may still change unseen (S3 times are in
    /// seconds; a metadata change keeps the ETag and size): until then a stamp does not name
    /// one version.
    static let unsettled: TimeInterval = 2
    /// `unsettled`, for this store (tests that write nothing twice in a second take 0: what
    /// they wrote is settled at once, where they waited two seconds of the server's clock).
    public var settleWindow = S3Store.unsettled

    // MARK: - Snapshots

    /// Reads the bucket's latest snapshot into the index unless it did before; whether it
    /// read one. A snapshot that cannot be read is said, and the objects get HEADs.
    /// `through`: only the parts up to that key (a fresh device's first part of the bucket),
    /// and `parts`: at most that many; the next load takes the rest, from where this stopped
    /// (`snapshotPartSetting`). One load at a time: each waits for the one before.
    private func loadLatestSnapshot(through: String? = nil, parts: Int = .max) async -> Bool {
        await snapshotLoads.run { await loadLatestSnapshotNow(through: through, parts: parts) }
    }

    private func loadLatestSnapshotNow(through: String?, parts: Int) async -> Bool {
        // A snapshot none of whose parts is sealed with this bucket's key (forged, or written
        // with other credentials) is passed over for the one before it, once.
        for _ in 0 ..< 2 {
            let (read, forged) = await loadLatestSnapshotOnce(through: through, parts: parts)
            guard let forged else { return read }
            snapshots.noteForged(forged)
            lock.withLock { latestSnapshot = nil }
        }
        return false
    }

    /// One try of `loadLatestSnapshotNow`; the name of the snapshot if none of its parts read
    /// was sealed.
    private func loadLatestSnapshotOnce(through: String?, parts: Int) async -> (Bool, forged: String?) {
        do {
            guard let latest = try await snapshots.latest() else { return (false, nil) }
            let written = writtenAt(latest)
            lock.withLock { if (latestSnapshot?.at ?? .distantPast) < written { latestSnapshot = (written, latest.time) } }
            if try index.setting("snapshot") == latest.name { return (false, nil) }
            // Where a load of its first parts stopped ("NAME PART").
            let resumed = try index.setting(Self.snapshotPartSetting).flatMap { v -> Int? in
                let p = v.split(separator: " ")
                return p.count == 2 && p[0] == latest.name ? Int(p[1]) : nil
            } ?? 0
            let loaded = try await snapshots.load(latest, into: index, from: resumed, through: through, parts: parts)
            for what in loaded.unreadable.lines { logger.warning("passing over what a snapshot holds but cannot be read: \(what)") }
            if loaded.entries == 0 && loaded.unsealed > 0 { return (false, latest.name) }
            if let next = loaded.next {
                try index.setSetting(Self.snapshotPartSetting, "\(latest.name) \(next)")
            } else {
                try index.setSetting("snapshot", latest.name)
                if resumed > 0 { try index.removeSetting(Self.snapshotPartSetting) }
            }
            let which = loaded.next.map { " (parts \(resumed) to \($0 - 1))" } ?? (resumed > 0 ? " (parts \(resumed) on)" : "")
            logger.info("learned \(loaded.entries) objects' metadata from the bucket's snapshot \(latest.name)\(which) (\(loaded.requests) requests)")
            return (true, nil)
        } catch {
            logger.warning("could not read the bucket's snapshot (\(error)); asking for each object instead")
            return (false, nil)
        }
    }

    /// `read()` once `answer` says yes, where `wanted`; else false.
    private func readWhenSaid(_ answer: AsyncAnswer, _ wanted: Bool, _ read: () async -> Bool) async -> Bool {
        guard wanted, await answer.value else { return false }
        return await read()
    }

    /// The index's setting of the snapshot whose first parts alone were read, and the part
    /// the rest begins at.
    static let snapshotPartSetting = "snapshot-part"

    /// Whether the last snapshot this index read from was read only in part.
    private var snapshotReadInPart: Bool { ((try? index.setting(Self.snapshotPartSetting)) ?? nil) != nil }

    /// Whether this device writes a snapshot with its full `listing`: when a listing needed
    /// many HEADs (so would a new device), when as many objects were written since the latest
    /// (a new device would need a HEAD for each: a bucket filled through one device, whose own
    /// puts need none there, kept the snapshot of the bucket before for a day), or when the
    /// latest is `snapshotInterval` old (each device waits a random quarter more: of many
    /// devices, one writes it).
    private func snapshotDue(_ listing: Listing) async throws -> Bool {
        let (wanted, known) = lock.withLock { (snapshotWanted, latestSnapshot) }
        if wanted { return true }
        let interval = snapshotInterval * snapshotJitter
        let worth = snapshotWorth(listing.objects.count)
        if let known, time.now.timeIntervalSince(known.at) < interval, Self.written(since: known.time, in: listing, settleWindow: settleWindow) < worth { return false }
        // Due by what this device knew (or it never looked): one LIST says whether another
        // device wrote one since.
        let latest = try await snapshots.latest()
        let now = (at: latest.map(writtenAt) ?? .distantPast, time: latest?.time ?? 0)
        lock.withLock { latestSnapshot = now }
        return time.now.timeIntervalSince(now.at) >= interval || Self.written(since: now.time, in: listing, settleWindow: settleWindow) >= worth
    }

    /// Objects a new device would ask for one by one that make a snapshot worth writing.
    private func snapshotWorth(_ objects: Int) -> Int { max(headsWorthASnapshot, objects / 20) }

    /// The listed objects a snapshot written at the server's `time` (ms) may not hold: written
    /// after its listing's settled ones (`unsettled` before the listing's time, which its
    /// `Date` gives in whole seconds; objects' times are in seconds too).
    static func written(since time: Int64, in listing: Listing, settleWindow: TimeInterval = unsettled) -> Int {
        let since = Date(timeIntervalSince1970: Double(time) / 1000 - settleWindow - 1)
        return listing.objects.reduce(0) { n, o in n + ((o.modified ?? .distantFuture) >= since ? 1 : 0) }
    }

    /// When `snapshot` was written, by this device's clock.
    private func writtenAt(_ snapshot: S3Snapshots.Found) -> Date {
        time.now.addingTimeInterval(-TimeInterval(log.serverNow() - snapshot.time) / 1000)
    }

    /// Writes a snapshot of `listing` (HEADs for what the index does not know), and prunes
    /// the old ones. A failure is said and waits as a snapshot written would.
    private func writeSnapshot(_ listing: Listing) async {
        // Named by when its listing was taken: it holds what was settled then (a device new to
        // the bucket reads the log from a moment before that: `lastLookOrSnapshot`).
        let taken = Int64(listing.taken.timeIntervalSince1970 * 1000)
        do {
            var count = 0
            let written = try await snapshots.write(time: taken, device: index.id) { add in
                try await describe(listing, counted: false, pagesOf: describePage) { page in
                    let settled = page.filter { Self.settled($0.0, $0.1, in: listing, within: settleWindow) }
                    count += settled.count
                    try await add(settled)
                }
            }
            try index.setSetting("snapshot", written.name)
            logger.info("wrote a snapshot of the bucket's \(count) objects (\(written.parts.count) parts)")
            try await snapshots.prune(now: log.serverNow())
        } catch {
            logger.warning("could not write a snapshot of the bucket (\(error)); trying again in \(Int(snapshotInterval)) s, or when many objects were written since")
        }
        // (A failure too waits for the interval, or for as many objects written since.)
        lock.withLock { snapshotWanted = false; latestSnapshot = (time.now, taken) }
        try? index.setSetting(Self.snapshotWish, "0")
    }

    /// The index's setting that says a snapshot is wanted.
    static let snapshotWish = "snapshot-wanted"

    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        try await objects.read(key, version: version, range: range)
    }

    public func read(_ key: String, version: String, range: Range<Int64>, into fd: Int32, at offset: Int64) async throws -> Int64 {
        try await objects.read(key, version: version, range: range, into: fd, at: offset)
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata, condition: WriteCondition) async throws -> ObjectInfo {
        try await put(key, contentsOf: source, metadata: metadata, condition: condition, progress: nil)
    }

    /// Writes `key`. On SeaweedFS a folder that holds objects, or held some, is a directory of
    /// the server's own, which refuses a marker `If-None-Match: *` though no marker was ever
    /// written (another tool's folder: its listing shows none): such a marker is written over
    /// the directory (a marker holds nothing that could be lost).
    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata, condition: WriteCondition,
                    progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        try await deletes.settle(key)
        return try await logging("put", key, wrote: { $0 }) {
            do {
                return try await objects.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: progress)
            } catch StoreError.preconditionFailed(let k, let current) {
                guard case .ifAbsent = condition, key.hasSuffix("/"), !objects.keepsFolderMetadata,
                      try await !objects.listsMarker(key) else { throw StoreError.preconditionFailed(key: k, current: current) }
                return try await objects.put(key, contentsOf: source, metadata: metadata, condition: .always, progress: progress)
            }
        }
    }

    public func copy(from source: String, version: String, to destination: String, metadata: ObjectMetadata?,
                     condition: WriteCondition) async throws -> ObjectInfo {
        try await deletes.settle(source)
        if destination != source { try await deletes.settle(destination) }
        return try await logging("put", destination, movedFrom: source == destination ? nil : source, wrote: { $0 }) { () async throws -> ObjectInfo in
            do {
                return try await objects.copy(from: source, version: version, to: destination, metadata: metadata, condition: condition)
            } catch StoreError.preconditionFailed(let k, let current) {
                // A folder's marker copied where the server has a directory and no marker (as `put`).
                guard case .ifAbsent = condition, destination.hasSuffix("/"), !objects.keepsFolderMetadata,
                      try await !objects.listsMarker(destination) else { throw StoreError.preconditionFailed(key: k, current: current) }
                return try await objects.copy(from: source, version: version, to: destination, metadata: metadata, condition: .always)
            }
        }
    }

    public func delete(_ key: String, condition: WriteCondition) async throws {
        try await deletes.settle(key)
        try await logging("delete", key, wrote: { _ in nil }) {
            try await objects.delete(key, condition: condition)
        }
    }

    /// A move's second half waits for the move's log object (`S3DeferredDeletes`); meanwhile
    /// this device sees the key as deleted.
    public func deleteMoved(_ key: String, version: String, to destination: String) async throws {
        try await deletes.settle(key)
        guard deletes.deferDelete(key, version: version) else {
            return try await delete(key, condition: .ifMatch(version))
        }
        let row = index.noteUnlogged(op: "delete", key: key)
        lock.withLock { recentListing = nil }
        log.record(.init(op: "delete", key: key, version: nil, row: row, deferred: true))
    }

    /// Runs a write of `key` and logs it (`op`: the entry's), noted in the index first, so that
    /// a crash before its log object loses no entry: the next run publishes what the index
    /// holds. A write refused (another device's version, a key gone or not allowed, the quota)
    /// is not logged (its row, if a crash keeps it, is a harmless hint); one that failed
    /// otherwise (its answer lost: it may have been made) is, as a hint without a version.
    /// The last full listing is no longer one to reuse. A put's entry says what it wrote, and a
    /// copy's where from (`movedFrom`: a move's first half, when the delete of that key follows).
    private func logging<T>(_ op: String, _ key: String, movedFrom: String? = nil, wrote: (T) -> ObjectInfo?,
                            _ write: () async throws -> T) async throws -> T {
        let row = index.noteUnlogged(op: op, key: key)
        lock.withLock { recentListing = nil }
        do {
            let done = try await write()
            let info = wrote(done)
            log.record(.init(op: op, key: key, version: info?.version, wrote: info, at: log.serverNow(), row: row, from: movedFrom))
            return done
        } catch let e as StoreError {
            switch e {
            case .preconditionFailed, .notFound, .invalidKey, .quotaExceeded: break
            default: log.record(.init(op: op, key: key, version: nil, row: row))
            }
            throw e
        } catch {
            log.record(.init(op: op, key: key, version: nil, row: row))
            throw error
        }
    }

    /// Writes what this device changed to the change log (an upload round ends).
    public func publishChanges(holdingMoves: Bool) async throws { try await log.publish(holdingMoves: holdingMoves) }

    /// The next `changes(since:)` lists the whole bucket, whatever the interval says.
    public func lookEverywhereNext() { lock.withLock { fullListingAsked = true } }

    /// The keys that changed since `cursor`: from the change log, or, when a full listing is
    /// due (at the first call, every `fullListingInterval`, when asked), by listing the whole
    /// bucket again and comparing. All at once (`limit` does not apply). A cursor this device's
    /// index does not hold (after a crash between the two, or from elsewhere), or one older
    /// than its latest, is a reset.
    ///
    /// A cursor is `LISTING@LOG`: the index's listing generation, and the server's time (ms)
    /// of the last look at the log.
    public func changes(since cursor: String?, limit: Int) async throws -> ChangeBatch {
        let parts = cursor.map { $0.split(separator: "@", maxSplits: 1).map(String.init) } ?? []
        let since = parts.first
        let from = parts.count == 2 ? Int64(parts[1]) : nil
        let full = lock.withLock {
            fullListingAsked || lastFullListing.map { time.now.timeIntervalSince($0) >= fullListingInterval } ?? true
        }
        guard !full, let since, let from else { return try await listEverything(since: since, cursor: cursor) }
        let reset = ChangeBatch(changes: [], cursor: cursor ?? "", reset: true)
        guard try index.isLatest(since) else { return reset }
        let read = try await log.look(from: from, markOnly: false)
        guard let next = try index.nextGeneration(since: since, told: read.changes.filter { $0.kind == .put }.map(\.key))
        else { return reset }
        log.noteRead(read)  // a cursor older than `next` is a reset from now on: nothing is missed
        noteLogPosition(read.position)
        var notes: [KeyBytes: ChangeLog.Note] = [:]
        for (c, n) in zip(read.changes, read.notes) { notes[KeyBytes(c.key)] = n }
        claimOthers(read)
        lock.withLock { lastLook = (read.requests, false); lastNotes = notes }
        return ChangeBatch(changes: read.changes, cursor: next + "@\(read.position)", reset: false, unreadable: read.unreadable.lines)
    }

    /// The changes the last look at the log found, with what their keys hold now where one
    /// listing of their folder says it for many (a folder of files moved, copied or deleted on
    /// another device: a HEAD each was 20,000 requests for a folder of 10,000 files moved). A
    /// delimiter listing of the folder (1,000 files a request) shows each file there with its
    /// ETag, size and time. A put whose entry says it wrote what the listing shows (the same
    /// ETag and size, modified no more than a second after the entry's time) is that entry's object; a deleted
    /// key the listing does not show is gone. A folder is listed where at least
    /// `changesWorthAListing` of its files changed, from just before the first of them to the
    /// last, in at most a request per `changesWorthAListing` of them (a LIST costs about 12.5
    /// HEADs at AWS's prices): a folder being moved, 200 keys a poll, is a LIST a poll whatever
    /// it holds already. The rest is left to a HEAD, as before: a key changed
    /// twice, a folder (its marker), a put whose entry says nothing of what it wrote, this
    /// device's own puts (the feed knows them by their origin), everything when a listing fails.
    public func confirmed(_ changes: [StoreChange]) async -> [StoreChange] {
        let notes = lock.withLock { lastNotes }
        var changes = changes
        var times: [KeyBytes: Int] = [:]
        for c in changes { times[KeyBytes(c.key), default: 0] += 1 }
        var byFolder: [String: [Int]] = [:]
        for (i, c) in changes.enumerated() where !c.key.hasSuffix("/") && times[KeyBytes(c.key)] == 1 {
            guard let note = notes[KeyBytes(c.key)] else { continue }
            if c.kind == .put && (c.claimed == nil || note.at == nil || note.mine) { continue }
            byFolder[StoreKey.folder(of: c.key), default: []].append(i)
        }
        var requests = 0
        // What a listing confirmed is remembered at its listing stamp, as a HEAD's answer is
        // (`describe`): the next full listing, and a snapshot, ask nothing more of it (the
        // files of a folder moved on another device were a HEAD each there, twice).
        var learned: [(stamp: String, info: ObjectInfo)] = []
        for (folder, members) in byFolder.sorted(by: { $0.key < $1.key }) {
            guard members.count >= Self.changesWorthAListing else { continue }
            let keys = members.map { changes[$0].key }.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            let found: (listing: Listing, through: String?)
            do {
                found = try await objects.listFolder(folder, from: keys.first!, to: keys.last!,
                                                     maxPages: members.count / Self.changesWorthAListing)
            } catch {
                continue  // a HEAD each, as before
            }
            requests += found.listing.requests
            var shown: [KeyBytes: ListedObject] = [:]
            for o in found.listing.objects { shown[KeyBytes(o.key)] = o }
            for i in members {
                let c = changes[i]
                // Past where a listing cut short reached, nothing is known.
                if let through = found.through, through.utf8.lexicographicallyPrecedes(c.key.utf8) { continue }
                let o = shown[KeyBytes(c.key)]
                switch c.kind {
                case .delete:
                    if o == nil { changes[i].current = .absent }
                case .put:
                    guard let o, let claim = c.claimed, let at = notes[KeyBytes(c.key)]?.at, Self.bearsOut(o, claim, at: at) else { continue }
                    changes[i].current = .object(claim)
                    if Self.settled(o, claim, in: found.listing, within: settleWindow) { learned.append((o.stamp, claim)) }
                }
            }
        }
        try? index.remember(learned)
        lock.withLock { lastLook.requests += requests; lastNotes = [:] }
        return changes
    }

    /// Whether a listed object is what a log entry says its put wrote (`at`: the server's ms
    /// when the write was answered): the same ETag and size, modified no more than a second
    /// after (S3 times are in seconds).
    static func bearsOut(_ o: ListedObject, _ claim: ObjectInfo, at: Int64) -> Bool {
        guard let modified = o.modified else { return false }
        return claim.contentTag == o.etag && S3Objects.Version(claim.version).etag == o.etag && claim.size == o.size
            && modified.timeIntervalSince1970 * 1000 <= Double(at) + 1000
    }

    /// Changes in one folder a LIST of it is worth (it costs about 12.5 HEADs at AWS's prices).
    static let changesWorthAListing = 13

    /// A full listing, compared with the last one. The log objects there are now are noted
    /// as read first: what they name is in this listing.
    /// `tell`: the changes are wanted (not for a cursor alone).
    /// `firstPart`: a fresh device's first listing stops after that many objects (see
    /// `startingCursor`).
    private func listEverything(since: String?, cursor: String?, tell: Bool = true, firstPart: Int? = nil) async throws -> ChangeBatch {
        // The importer's listing at a mount again, when this is the feed's first full listing
        // (not one asked for: `ubiq sync --full` lists anew). After a fresh device's first part,
        // that listing whatever was asked (one taken anew would tell every key past the part:
        // millions of changes), and one asked for comes at the next look.
        var askedStill = false
        let taken = lock.withLock { () -> (listing: Listing, marked: ChangeLog.Read)? in
            defer { premarked = nil }
            guard since != nil, let p = premarked, !fullListingAsked || firstPartOnly,
                  firstPartOnly || time.now.timeIntervalSince(p.at) < Self.premarkedFor else { return nil }
            askedStill = fullListingAsked
            return (p.listing, p.marked)
        }
        let marked: ChangeLog.Read
        let listing: Listing
        if let taken {
            (marked, listing) = (taken.marked, taken.listing)
        } else {
            // (A fresh device's first listing reads the log since the latest snapshot.)
            marked = try await (since == nil && index.neverListed() ? lookSinceLastRun() : log.look(from: nil, markOnly: true))
            // A device that never read a snapshot of the bucket reads the latest while it lists,
            // once the listing's first page says there is more than a page: one after the other,
            // a fresh device's mount at 100,000 objects listed for 3 s and then read it for 2.
            // Of a first part, the snapshot's first parts (what is past them waits for the rest).
            let fresh = since == nil && (try? index.setting("snapshot")) == nil
            let parts = firstPart.map { $0 / max(1, snapshots.entriesPerPart) + 1 } ?? .max
            // Said by the listing's first page (a child task of this one waits for it: a task of
            // its own would run on the cooperative pool, which blocked callers may hold).
            let more = AsyncAnswer()
            async let snapshot = readWhenSaid(more, fresh) { await self.loadLatestSnapshot(parts: parts) }
            do {
                listing = try await objects.listAll(under: "", pageSize: listingPageSize, stoppingAfter: firstPart ?? .max) {
                    more.say(true)
                }
            } catch {
                more.say(false)
                _ = await snapshot
                throw error
            }
            more.say(false)
            _ = await snapshot
            if listing.through == nil, snapshotReadInPart { _ = await loadLatestSnapshot() }
            warn(listing.skipped)
        }
        // The listing the importer brought in what it did not know from, after a first part:
        // the keys past that part are in (`S3Index.advance`).
        guard var (changes, next) = try index.advance(since: since, to: listing, unsettled: settleWindow,
                                                      stableFolders: !objects.keepsFolderMetadata, tell: tell,
                                                      quietPastFirstPart: taken != nil) else {
            return ChangeBatch(changes: [], cursor: cursor ?? "", reset: true)
        }
        // A first listing's changes are every object: the feed takes its cursor only.
        if since != nil { try tellKnown(&changes, in: listing) }
        log.noteRead(marked)
        noteLogPosition(marked.position)
        lock.withLock { firstPartOnly = listing.through != nil }
        // A first part is no full listing: the next look lists the bucket whole, and a
        // snapshot of a part would cost every new device its HEADs.
        if listing.through == nil {
            listed(requests: marked.requests + listing.requests)
            if askedStill { lookEverywhereNext() }
            try? await log.prune(olderThan: logRetention)
            if (try? await snapshotDue(listing)) == true { await writeSnapshot(listing) }
        }
        // Kept a moment for `list` (any listing after the cursor's previous one will do: the
        // feed has what changed since), then let go: a large bucket's listing is large.
        let at = time.now
        lock.withLock { recentListing = (listing, at) }
        later(10) { if $0.recentListing?.at == at { $0.recentListing = nil } }
        return ChangeBatch(changes: changes, cursor: next + "@\(marked.position)", reset: false)
    }

    /// The index's setting of the server's time (ms) of this device's last look at the log.
    static let logPositionSetting = "log-position"

    /// Written when it moved a minute or more since last written (a write each poll was a
    /// SQLite commit every 3 s for nothing): a mount again reads the log from up to a minute
    /// earlier than it could, which its entries' claims make no worse than a few more GETs.
    private func noteLogPosition(_ position: Int64) {
        guard position > 0, lock.withLock({ () -> Bool in
            guard position - logPositionWritten >= Self.logPositionEvery else { return false }
            logPositionWritten = position
            return true
        }) else { return }
        try? index.setSetting(Self.logPositionSetting, String(position))
    }

    /// How far (ms) the log position moves before it is written again.
    static let logPositionEvery: Int64 = 60_000
    private var logPositionWritten: Int64 = 0

    /// Log objects the first listing of a run reads, at most: past that, HEADs are cheaper
    /// (tests set fewer).
    var logObjectsReadAtAMountAgain = 500

    /// At the run's first listing (a mount again), the log since this device last looked at it
    /// (up to `logObjectsReadAtAMountAgain` objects, else only marked, as a full listing
    /// marks them): what other devices' entries say their puts wrote is kept (`index.claim`), so
    /// that `describe` takes each new object the listing bears out from its entry, not a HEAD.
    /// A device back after another added 10,000 files sent 10,000 HEADs; now a GET per upload
    /// round of the writer's.
    /// A device new to the bucket reads it from the latest snapshot on (from the log's start
    /// without one): what was written since the snapshot, most of a bucket filled through
    /// another device until that device's next full listing writes one, needs no HEAD either.
    /// (One page of names at most: more log objects than that are not worth reading, and a
    /// look that fails is only the HEADs it would have saved.)
    private func lookSinceLastRun() async throws -> ChangeLog.Read {
        if let (from, reading) = await lastLookOrSnapshot(),
           let read = try? await log.look(from: from, markOnly: false, readingAtMost: logObjectsReadAtAMountAgain, namePages: 1,
                                          readingFrom: reading),
           read.whole {
            claimOthers(read)
            return read
        }
        return try await log.look(from: nil, markOnly: true)
    }

    /// Where `lookSinceLastRun` looks at the log from (the server's ms, less the log's window),
    /// and from when on it reads what it finds (the rest is only marked as read): this device's
    /// last look, all read; else, for a device that never listed the bucket, the latest
    /// snapshot's time (0: there is none) less a few seconds, and at most the window before
    /// now: what was logged before that holds only puts the snapshot's listing saw, settled
    /// (reading the window's minute before it was 196 GETs for nothing at a fresh mount after
    /// a folder of 10,000 files, and leaving those unmarked had the first poll read them);
    /// nil: nowhere.
    private func lastLookOrSnapshot() async -> (from: Int64, reading: Int64)? {
        if let position = (try? index.setting(Self.logPositionSetting)).flatMap({ $0.flatMap(Int64.init) }) {
            return (position, .min)
        }
        guard (try? index.neverListed()) == true else { return nil }
        // (`unsettled`, and the server's time as each device reckons it: a second or so each.)
        guard let time = try? await snapshots.latest()?.time ?? 0 else { return nil }
        let reading = time - Int64((settleWindow + 3) * 1000)
        let window = Int64(ChangeLog.window * 1000)
        return (min(reading + window, log.serverNow()), reading)
    }

    /// Keeps what other devices' entries in `read` say their puts wrote (a delete, or a put
    /// that does not say, drops what was kept of its key), for the next listing to bear out
    /// (`claimsBorneOut`); this device's own are kept as they are logged.
    private func claimOthers(_ read: ChangeLog.Read) {
        try? index.claim(zip(read.changes, read.notes).filter { !$0.1.mine }.map { c, n in
            (c.key, c.kind == .put ? c.claimed : nil, n.at)
        })
    }

    /// Of the `listed` objects not in `known`, those the log's entries say what they hold
    /// (`claimOthers`, and this device's own puts), where the listing bears the entry out (the
    /// same ETag and size, modified no more than a second after the write was answered) and
    /// the object is settled: each with what its entry says, to be remembered at its stamp.
    private func claimsBorneOut(_ listed: [ListedObject], known: [KeyBytes: ObjectInfo],
                                in listing: Listing) throws -> [(stamp: String, info: ObjectInfo)] {
        let unknown = listed.filter { known[KeyBytes($0.key)] == nil }
        let claims = try index.claims(unknown.map(\.key))
        return unknown.compactMap { o in
            guard let (claim, at) = claims[KeyBytes(o.key)], Self.bearsOut(o, claim, at: at),
                  Self.settled(o, claim, in: listing, within: settleWindow) else { return nil }
            return (o.stamp, claim)
        }
    }

    /// A put the index knows at its listed stamp (what a HEAD said, or a listing confirmed of
    /// the change log) is told with what it holds: the feed asks nothing more of it. So is a
    /// put the change log told of (this device's or another's) that the listing bears out as
    /// `confirmed` does (the same ETag and size, modified no more than a second after the write
    /// was answered), when settled. A folder of 3,000 files moved on another device was 6,003
    /// HEADs at the reader's next full listing; 3,000 files uploaded, 3,001 at the writer's.
    private func tellKnown(_ changes: inout [StoreChange], in listing: Listing) throws {
        var at: [KeyBytes: Int] = [:]
        for (i, c) in changes.enumerated() where c.kind == .put { at[KeyBytes(c.key)] = i }
        let listed = at.isEmpty ? [] : listing.objects.filter { at[KeyBytes($0.key)] != nil }
        var known = try index.known(listed)
        let learned = try claimsBorneOut(listed, known: known, in: listing)
        for (_, claim) in learned { known[KeyBytes(claim.key)] = claim }
        for (k, told) in known {
            guard let i = at[k] else { continue }
            changes[i].version = told.version
            changes[i].current = .object(told)
        }
        try index.remember(learned)
        // What the listing reported is known from it now; a write a minute before it, too.
        try index.forgetClaims(Set(changes.lazy.map { KeyBytes($0.key) }), before: Int64((listing.taken.timeIntervalSince1970 - 60) * 1000))
    }

    private func listed(requests: Int) {
        lock.withLock {
            lastFullListing = time.now
            fullListingAsked = false
            lastLook = (requests, true)
            lastNotes = [:]
        }
    }

    /// Runs `body` under the lock `seconds` from now, if the store is still there: a listing
    /// kept for a moment is let go (a large bucket's listing is large).
    private func later(_ seconds: TimeInterval, _ body: @escaping @Sendable (S3Store) -> Void) {
        DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { [weak self] in
            guard let self else { return }
            lock.withLock { body(self) }
        }
    }

    /// A full listing from nothing (`advance(since: nil)` always answers).
    public func currentCursor() async throws -> String {
        try await listEverything(since: nil, cursor: nil, tell: false).cursor
    }

    /// A device new to the bucket lists its first `objects` only (a million objects are 1,000
    /// LISTs, which its mount waited for): the importer brings that part in from `list`, the
    /// feed's first poll lists the bucket whole and brings in the rest. An index that listed the
    /// bucket before lists it whole, as `currentCursor` does.
    public func startingCursor(listingFirst objects: Int) async throws -> String {
        guard try index.neverListed() else { return try await currentCursor() }
        return try await listEverything(since: nil, cursor: nil, tell: false, firstPart: max(1, objects)).cursor
    }

    /// The bucket's versions of `key` when it keeps them; else the current one.
    public func versions(of key: String) async throws -> [ObjectInfo] {
        try await deletes.settle(key)
        if objects.versioned { return try await objects.allVersions(key) }
        do { return [try await objects.head(key)] } catch StoreError.notFound { return [] }
    }

    /// S3 says nothing of quotas, and summing a bucket costs a listing: nil.
    public func usage() async throws -> StoreUsage? { nil }

    public var keepsPriorVersions: Bool { objects.versioned }
}

extension S3Objects {
    /// Whether the server refuses a create over an existing object (`If-None-Match: *`).
    func serverChecksConditions() async throws -> Bool {
        let probe = Self.reserved + "probe-" + UUID().uuidString.lowercased()
        try await send(.PUT, probe, body: .data(Data()), validate: false)
        var honoured = false
        do {
            try await send(.PUT, probe, headers: ["If-None-Match": "*"], body: .data(Data()), validate: false)
        } catch StoreError.preconditionFailed {
            honoured = true
        }
        _ = try? await send(.DELETE, probe, validate: false)
        return honoured
    }

    /// Whether a folder marker keeps the metadata header it was written with.
    func serverKeepsFolderMetadata() async throws -> Bool {
        let probe = Self.reserved + "probe-" + UUID().uuidString.lowercased() + "/"
        try await send(.PUT, probe, headers: [Self.metadataHeader: "probe"], body: .data(Data()), validate: false)
        let kept = try await send(.HEAD, probe, validate: false).header(Self.metadataHeader) == "probe"
        _ = try? await send(.DELETE, probe, validate: false)
        return kept
    }
}
