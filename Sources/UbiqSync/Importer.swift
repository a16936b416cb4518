import Foundation
import UbiqClock
import Logging
import UbiqState
import UbiqStore

/// Brings what the store holds into the device's state as placeholders:
/// true name, type, size, mode and times, no bytes. Runs at mount, before
/// the filesystem loads. Keys the device already knows (as a name's remote
/// key, or as a pending delete) are left alone; names from the store are
/// validated, and keys that are not valid paths are skipped with a warning.
public struct Importer {
    let store: any CloudStore
    let state: LocalState
    let cache: ContentCache
    let logger: Logger
    /// This device's id: an object it wrote that no item here records is not imported (below).
    let deviceID: String?
    /// Objects taken from the store's listing at a time (`defaultPageSize`; a test's smaller).
    let pageSize: Int

    public init(store: any CloudStore, state: LocalState, cache: ContentCache, logger: Logger, deviceID: String? = nil,
                pageSize: Int = Importer.defaultPageSize) {
        self.store = store; self.state = state; self.cache = cache; self.logger = logger; self.deviceID = deviceID
        self.pageSize = pageSize
    }

    public struct Report: Sendable, Equatable {
        public var added = 0
        public var skipped = 0
        /// The whole listing was brought in (not: `run` stopped at its bound, and the feed's
        /// first poll brings in the rest while the file system answers).
        public var complete = true
    }

    /// Objects of the store's listing a device new to it brings in before its mount answers:
    /// a larger store's rest comes in through the feed's first poll (`ChangeFeed.importFirst`),
    /// while the mount answers. (A million objects on the embedded store kept a mount from
    /// answering for 22.5 s; 100,000, 1.8 s.)
    public static let beforeMount = 100_000

    /// `run` stopped at its bound.
    private struct Bounded: Error {}

    /// Objects taken from the store's listing at a time, each page in a transaction of its own:
    /// a million keys at once were the mount's peak (900 MB) and most of its time.
    public static let defaultPageSize = 10_000

    /// Set in the state once a whole listing of the store was brought in: a mount again takes
    /// the next in its feed's first poll (`runLive`), which the mount waits for 2 s at most.
    public static let doneKey = "store_imported"

    /// Whether this state brought in a whole listing of the store before.
    public static func importedBefore(_ state: LocalState) -> Bool {
        (try? state.read { try $0.meta(doneKey) }) == "1"
    }

    /// Brings the store's listing in, a page at a time; stops after the page that reaches
    /// `limit` objects handed on (`Report.complete` false), and then does not mark
    /// the store imported: the feed's first poll lists it again and brings in the rest.
    @discardableResult
    public func run(upTo limit: Int? = nil) throws -> Report {
        // What the pages counted crosses into the store's task (which runs one page after
        // another while this thread waits).
        let tally = UncheckedBox(Report())
        let listed = UncheckedBox(0)
        // Besides the placeholders, this listing is where leftovers of this device's
        // unanswered uploads are found (below).
        do {
            try listUnknown(stopping: { false }) { objects in
                try self.importPage(objects, tally)
                listed.value += objects.count
                if let limit, listed.value >= limit { throw Bounded() }
            }
        } catch is Bounded {
            tally.value.complete = false
        } catch is ListingCutShort {
            // The store listed its first part only (`CloudStore.startingCursor`).
            tally.value.complete = false
        }
        let report = tally.value
        if report.complete { try state.write { try $0.setMeta(Self.doneKey, "1") } }
        if report.added > 0 || report.skipped > 0 {
            logger.info("imported \(report.added) items from the store, skipped \(report.skipped)\(report.complete ? "" : "; the rest comes in while the mount answers")")
        }
        return report
    }

    /// The same listing while the file system already answers (a mount again, or a mount whose
    /// first listing failed: `ChangeFeed.importFirst`): each page's objects the device has no
    /// record of are handed to `apply` as the feed's changes of another device are, rather than
    /// written into the state behind the file system's back. An object this device wrote that
    /// no item records (an upload whose answer never came) is not brought back: a tombstone for
    /// an unrecorded upload deletes it, which looks again before it deletes (an upload
    /// answered meanwhile is recorded by then, and stays). `stopping` is asked between pages
    /// (an unmount does not wait for a million keys).
    /// `listed` is told, as the listing goes, a key up to which every object of the store is
    /// here (this device knew it, or it was applied).
    public func runLive(stopping: @escaping () -> Bool, listed: @escaping (String) -> Void = { _ in },
                        _ apply: @escaping ([RemoteChange]) throws -> Void) throws {
        let progress = ListingProgress(listed)
        try listUnknown(stopping: stopping, offered: progress.offered) { objects in
            if stopping() { throw CancellationError() }
            try apply(try self.livePage(objects))
            progress.applied()
        }
        try state.write { try $0.setMeta(Self.doneKey, "1") }
    }

    /// The store's whole listing, a page at a time, each page's objects this device does not
    /// know to `page` (in the store's task, while this thread waits; `stopping` ends a wait on
    /// the store). Asked again a moment later when the store fails transiently (the pages
    /// handed on by then are known, and not handed again): a failed LIST failed a mount
    /// again's first poll, and a user's `ubiq sync` with it.
    private func listUnknown(stopping: () -> Bool, offered: (([String], [Bool]) -> Void)? = nil,
                             _ page: @escaping ([ObjectInfo]) throws -> Void) throws {
        let (store, pageSize) = (self.store, self.pageSize)
        let page = UncheckedBox(page)
        let wanted = UncheckedBox { (keys: [String]) in
            let unknown = try self.unknown(keys)
            offered?(keys, unknown)
            return unknown
        }
        try retryingTransient(SyncRetries.listing) {
            try runBlocking(stopping: stopping) {
                try await store.list(prefix: "", pagesOf: pageSize, wanted: { try wanted.value($0) }) { try page.value($0) }
            }
        }
    }

    /// Of a page of objects the device did not know when it was listed, the changes to hand on.
    private func livePage(_ objects: [ObjectInfo]) throws -> [RemoteChange] {
        var out: [RemoteChange] = []
        for obj in objects where !ReservedKeys.isReserved(obj.key) && admitted(obj) {
            if let d = deviceID, let o = obj.metadata.origin, o.hasPrefix(d + ":") {
                let parts = StoreKey.segments(obj.key).parts
                try state.write { tx in
                    guard try tx.entries(remoteKey: obj.key).isEmpty, try tx.entry(atPath: parts) == nil else { return }
                    try tx.addTombstone(key: obj.key, version: StateTransaction.Tombstone.leftover)
                    logger.info("\(obj.key) is an upload of this device's that its item no longer needs: deleting it")
                }
                continue
            }
            out.append(RemoteChange(key: obj.key, info: obj))
        }
        return out
    }

    /// Whether `obj` can be brought in: a key that is a valid path, and metadata that are not
    /// left out (what is wrong with either is said).
    private func admitted(_ obj: ObjectInfo) -> Bool {
        do { try StoreKey.validate(obj.key) } catch {
            logger.warning("skipping store key \(obj.key.debugDescription): \(error)")
            return false
        }
        if let w = obj.inputWarning {
            logger.warning("\(w.message)")
            if w.leftOut { return false }
        }
        return true
    }

    /// Of a page's keys, those the device does not know: the store reads the
    /// metadata of these alone (a mount again knows nearly all, and reading every object's was
    /// half its time).
    private func unknown(_ keys: [String]) throws -> [Bool] {
        let known = try state.read { tx in Set(try tx.recordedKeys(among: keys).map(KeyBytes.init)) }
        return keys.map { !known.contains(KeyBytes($0)) && !ReservedKeys.isReserved($0) }
    }

    /// Brings one page of the listing in (what `unknown` kept of it; a key the device came to
    /// know meanwhile is left alone here too). In key order, a folder's marker comes before what
    /// is in it (`a/` is a prefix of `a/b`), as does a file before a key below the same name,
    /// so each page goes as the listing gives it (sorted again, for a store that would not).
    private func importPage(_ objects: [ObjectInfo], _ tally: UncheckedBox<Report>) throws {
        let sorted = objects.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
        guard !sorted.isEmpty else { return }
        try state.write { tx in
            var report = tally.value
            defer { tally.value = report }
            // Keys the device knows (as a name's remote key, or as a pending delete) are left alone.
            let known = Set(try tx.recordedKeys(among: sorted.map(\.key)).map(KeyBytes.init))
            var nextIno = max(UInt64(try tx.maxInode()) + 1, 2)
            let now = nowNanos()
            // The folder each path of folders came to in this page (a folder's files come one
            // after another: its path is looked up once, not once for each of them).
            var folders: [ArraySlice<String>: UInt64] = [:]
            // The folders this page made, with the names it put in them: a name in one is looked
            // for here rather than in the database (a fresh device's import: a lookup a file was
            // a quarter of the import's time).
            var made: [UInt64: Set<[UInt8]>] = [:]
            for obj in sorted where !known.contains(KeyBytes(obj.key)) && !ReservedKeys.isReserved(obj.key) {
                guard admitted(obj) else {
                    report.skipped += 1
                    continue
                }
                let (parts, isDir) = StoreKey.segments(obj.key)
                if let d = deviceID, let o = obj.metadata.origin, o.hasPrefix(d + ":"), try tx.entry(atPath: parts) == nil {
                    // Written by this device, recorded by no item here, and nothing here has its
                    // name: an upload whose answer never came, from an item deleted or renamed
                    // here since. Not a file to bring back: the uploader deletes it (if unchanged).
                    try tx.addTombstone(key: obj.key, version: obj.version)
                    logger.info("\(obj.key) is an upload of this device's that its item no longer needs: deleting it")
                    report.skipped += 1
                    continue
                }
                // Every folder on the way, made where missing.
                let path = parts.dropLast()
                let name = Array(parts.last!.utf8)
                guard let parent = try folders[path] ?? folder(path, tx, &nextIno, now, &made) else {
                    logger.warning("skipping \(obj.key): a file stands where its folder would be")
                    report.skipped += 1
                    continue
                }
                folders[path] = parent
                let m = obj.metadata
                if Self.mayHold(made, parent, name), let e = try tx.entry(parent: parent, name: name) {
                    // A folder created implicitly above, now with its marker: adopt it.
                    if isDir, e.remoteKey == nil, let r = try tx.inode(e.ino), r.type == UInt32(S_IFDIR) {
                        var r = r
                        r.perm = m.mode & 0o7777; r.uid = m.uid; r.gid = m.gid; r.mtimeNs = m.mtimeNs
                        try tx.upsert(r)
                        try tx.recordRemote(entryID: e.id, key: obj.key, obj)
                        try importXattrs(tx, e.ino, m)
                        report.added += 1
                    } else {
                        logger.warning("skipping \(obj.key): a local item has that name")
                        report.skipped += 1
                    }
                    continue
                }
                let type = (isDir ? ObjectKind.directory : m.kind).fileType
                let ino = nextIno; nextIno += 1
                let present = type != UInt32(S_IFREG) || obj.size == 0
                if type == UInt32(S_IFREG) && obj.size == 0 { try cache.createEmpty(ino) }
                try tx.insertUploaded(InodeRecord(ino: ino, type: type, perm: m.mode & 0o7777, uid: m.uid, gid: m.gid,
                                                  size: type == UInt32(S_IFREG) ? obj.size : 0,
                                                  atimeNs: m.mtimeNs, mtimeNs: m.mtimeNs, ctimeNs: now, rdev: m.rdev,
                                                  target: m.target.map { [UInt8]($0) }, present: present))
                try tx.insertEntry(parent: parent, name: name, ino: ino, remoteKey: obj.key, remoteVersion: obj.version,
                                   remoteTag: obj.contentTag, remoteDigest: obj.metadata.sha256, remoteFileID: obj.metadata.fileID)
                made[parent]?.insert(name)
                if type == UInt32(S_IFDIR) { made[ino] = [] }
                try importXattrs(tx, ino, m)
                report.added += 1
            }
        }
    }

    /// Whether folder `parent` may hold `name` already: a folder made in this transaction holds
    /// only the names `made` says it put in it; any other, what the database says.
    private static func mayHold(_ made: [UInt64: Set<[UInt8]>], _ parent: UInt64, _ name: [UInt8]) -> Bool {
        made[parent]?.contains(name) ?? true
    }

    /// The folder at `path` (folder names from the root), with those missing made on the way;
    /// nil when a file stands where one of them would be.
    /// `made`: the folders made in this transaction, with the names put in them (see `importPage`).
    private func folder(_ path: ArraySlice<String>, _ tx: StateTransaction, _ nextIno: inout UInt64, _ now: Int64,
                        _ made: inout [UInt64: Set<[UInt8]>]) throws -> UInt64? {
        var parent: UInt64 = 1
        for seg in path {
            let name = Array(seg.utf8)
            if Self.mayHold(made, parent, name), let e = try tx.entry(parent: parent, name: name) {
                guard let r = try tx.inode(e.ino), r.type == UInt32(S_IFDIR) else { return nil }
                parent = e.ino
            } else {
                let ino = nextIno; nextIno += 1
                try tx.insertUploaded(InodeRecord(ino: ino, type: UInt32(S_IFDIR), perm: 0o755, uid: getuid(), gid: getgid(),
                                                  atimeNs: now, mtimeNs: now, ctimeNs: now))
                try tx.insertEntry(parent: parent, name: name, ino: ino)
                made[parent]?.insert(name)
                made[ino] = []
                parent = ino
            }
        }
        return parent
    }

    private func importXattrs(_ tx: StateTransaction, _ ino: UInt64, _ m: ObjectMetadata) throws {
        for (k, v) in m.localXattrs { try tx.setXattr(ino, name: k, value: v) }
    }
}

/// How far a listing handed to the file system has come (`Importer.runLive`): the store offers
/// each page's keys (`offered`), in order, and hands on the pages with keys this device does
/// not know, in the same order, each applied before the next (`applied`); a page it hands
/// nothing of is in as soon as every page before it that was handed on is. The store may offer
/// a page before the last one handed on is applied (S3 looks the next page up meanwhile). A
/// listing asked again after the store failed (`retryingTransient`) starts over.
final class ListingProgress: @unchecked Sendable {
    private let lock = NSLock()
    /// The pages offered and not yet told: each one's last key, and whether it waits to be applied.
    private var pages: [(last: String, waits: Bool)] = []
    private var first = 0
    /// The last key offered (a page that does not start past it is a listing started over).
    private var lastOffered: String?
    private let listed: (String) -> Void

    init(_ listed: @escaping (String) -> Void) { self.listed = listed }

    func offered(_ keys: [String], _ wanted: [Bool]) {
        guard let start = keys.first, let last = keys.last else { return }
        lock.withLock {
            if let l = lastOffered, !l.utf8.lexicographicallyPrecedes(start.utf8) { pages = []; first = 0 }
            lastOffered = last
            pages.append((last, wanted.contains(true)))
        }
        tell()
    }

    func applied() {
        lock.withLock {
            if let i = pages[first...].firstIndex(where: \.waits) { pages[i].waits = false }
        }
        tell()
    }

    /// Tells the last key of the pages now in (outside the lock: `listed` takes the feed's).
    private func tell() {
        let through: String? = lock.withLock {
            var through: String?
            while first < pages.count, !pages[first].waits {
                through = pages[first].last
                first += 1
            }
            if first > 1_000 { pages.removeFirst(first); first = 0 }
            return through
        }
        if let through { listed(through) }
    }
}
