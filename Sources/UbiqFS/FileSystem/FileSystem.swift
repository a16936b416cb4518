import Foundation
import Synchronization
import UbiqClock
import Logging
import UbiqCoordinator
import UbiqState
import UbiqStore
import UbiqSync

/// The POSIX filesystem: inodes, names, handles. No libfuse types here; the
/// FUSE binding translates. Tests drive it directly.
///
/// STATE: every inode lives in the inode table (`inodes`, loaded from LocalState at start)
/// and each change to it is recorded in LocalState (`persist`: its intent log now, its
/// database with the next transaction) while the table's lock is held — so memory and
/// database change in the same order. One exception: a new file's rows wait to be
/// recorded with the next change, which is at the latest its first close
/// (`pendingCreates`). Content lives in cache files (`ContentCache`).
///
/// LOCK ORDERING: Coordinator claims first, then the inode table's lock (`InodeTable`).
public final class FileSystem: @unchecked Sendable {
    // Dependencies.
    let state: LocalState
    let coordinator: Coordinator
    let cache: ContentCache
    /// Where the cache files of dropped inodes go to the pool, off the request and the lock.
    private let recycling = DispatchQueue(label: "ubiq.fs.recycling")
    /// Inodes whose cache files wait for `recycling`, oldest first (emptied from the front by
    /// `recycleDropped`, on that queue only; a job is scheduled whenever it stops being empty).
    private let toRecycle = Mutex<[UInt64]>([])
    let materializer: Materializer
    let uploader: Uploader?
    let logger: Logger
    /// Seconds an upload waits after the last change (coalesces bursts of saves).
    let uploadDelay: TimeInterval
    /// Programs that may not trigger downloads (thumbnailers, indexers).
    let hydration: HydrationPolicy
    /// Local content to stay under (the sync engine's policy; this file system is its host).
    let cacheLimit: CacheLimit
    /// close(2) makes what was written durable against power loss, as fsync(2) does
    /// (`--sync-on-close`). Off: close commits, which a killed daemon never loses, and
    /// fsync is the promise against power loss, as on ext4.
    let syncOnClose: Bool
    /// When a read moves a file's access time (the mount's `relatime`, `strictatime`, `noatime`).
    let accessTimes: AccessTimes
    /// The rows of files made by `create` that no transaction has written yet, oldest first.
    /// The next transaction writes them before its own (`persist`): the file's first close,
    /// or anything else (a rename, an rm, a remote change, a status read), or a commit half a
    /// second on. A create thus costs no transaction of its own (tar x, cp -r: one a file, at
    /// the close, not two). A killed daemon loses such a file only if no close returned for it.
    /// Its own lock, held across the transaction that writes them (inside the inode table's
    /// lock when that is held: claims, the table, this, the database).
    let pendingCreates = Mutex<[(ino: UInt64, changes: [StateChange])]>([])
    /// How long a new file's rows may wait for a transaction (tests make it long).
    var pendingCreatesDelay: TimeInterval = 0.5
    /// How long one `sync` action waits for what it sent (`ubiq sync` asks again while that
    /// makes progress); a FUSE request, so bounded.
    public var syncWait: TimeInterval = 60
    /// How long after an open was sent back to look again (ESTALE) the opens of that file skip
    /// the kernel's page cache (`kernelSizeAtOpen`; a test shortens it).
    public var sizeUnsureFor: TimeInterval = StaleOpens.retryWindow
    /// Threads whose open was last answered ESTALE, and when (`mayAnswerStale`).
    let staleOpens = StaleOpens()
    /// Whether a commit of `pendingCreates` is scheduled: one timer a `pendingCreatesDelay`,
    /// not one a create (each close empties the list; a timer per file woke a thread per file).
    let pendingCreatesTimer = Mutex<Bool>(false)

    /// The kernel's caches of this file system (the FUSE binding: `attach(kernel:)`), held weakly.
    private weak var kernel: (any KernelNotifier)?
    /// What is sent to `kernel`, in order, by threads of their own: names, and inodes.
    private var notices: (names: KernelNotices<(UInt64, [UInt8])>, inodes: KernelNotices<(UInt64, Bool)>)?
    /// The store's changes (the change feed: `attach(feed:)`), held weakly (it holds this).
    private weak var feed: (any StoreFeed)?
    /// Guards `kernel`, `notices` and `feed`.
    private let channels = NSLock()
    /// When `notices` posted and sent each inode's notices (`kernelLookedUp`).
    let noticeTimes = InodeNoticeTimes()
    /// Where the daemon's control socket is (answered as the root's unlisted
    /// `user.ubiq.control-socket`, so the CLI finds it from any path).
    public let controlSocketPath = Mutex<String?>(nil)
    /// Events for `ubiq watch` and `ubiq query --watch`.
    public let events = EventBus()
    /// Items whose remote update waits for their last close, and what to call then.
    let waitingForClose = Mutex<Set<UInt64>>([])
    /// How long a read whose version is gone from the store waits for the move elsewhere that
    /// took it (`waitForAMove`): a folder's move deletes its old keys before the log tells of
    /// it, and a folder of 10,000 files takes many seconds to delete.
    let movedVersionWait: TimeInterval = 30
    /// A container's folder levels (nil: any depth).
    public let folderLevels = Mutex<FolderLevels?>(nil)

    /// The inodes in memory and every open handle (reached under its lock: `inodes.locked { t in … }`).
    let inodes = InodeTable()
    /// Nodes of files kept in memory past those that must be (`Inodes.residentLimit`): about
    /// 200 bytes each (docs/architecture.md, "Inodes in memory").
    public static let defaultResidentLimit = 100_000
    /// Nodes that differed from their rows as they were to leave memory (`UBIQ_NODE_CHECK`).
    public let nodeCheckFailures = Mutex(0)
    /// When the last local change, and the last read of a file's bytes, happened (uptime ns),
    /// read by the uploader: uploads wait while the mount is busy.
    let lastChange = Atomic<UInt64>(0)
    let lastRead = Atomic<UInt64>(0)

    public init(state: LocalState, coordinator: Coordinator, cache: ContentCache, materializer: Materializer,
                uploader: Uploader?, logger: Logger, rootOwner: Caller = Caller(uid: getuid(), gid: getgid()),
                uploadDelay: TimeInterval = 0.2, hydration: HydrationPolicy = .off, cacheLimit: CacheLimit,
                syncOnClose: Bool = false, accessTimes: AccessTimes = .relative,
                residentLimit: Int = FileSystem.defaultResidentLimit, checkNodes: Bool = false) throws {
        self.state = state
        self.coordinator = coordinator
        self.cache = cache
        self.materializer = materializer
        self.uploader = uploader
        self.logger = logger
        self.uploadDelay = uploadDelay
        self.hydration = hydration
        self.cacheLimit = cacheLimit
        self.syncOnClose = syncOnClose
        self.accessTimes = accessTimes
        setUpNodeSource(residentLimit: residentLimit, checking: checkNodes)
        try load(rootOwner: rootOwner)
        uploader?.attach(host: self)
        materializer.attach(sink: self)
        cacheLimit.attach(self)
        resumePinnedDownloads()
    }

    // MARK: - Loading and recovery

    private func load(rootOwner: Caller) throws {
        var repairs: [InodeRecord] = []
        var lost: [UInt64] = []
        var damaged: [UInt64] = []
        var dropped: [UInt64] = []
        var kept = Set<UInt64>()
        try inodes.locked { t in try state.write { tx in
            // Folders are always in memory, with their names; files are read when asked for.
            for r in try tx.directories() { t.insert(Node(r)) }
            if t.resident(rootIno) == nil {
                let now = nowNanos()
                let root = InodeRecord(ino: rootIno, type: UInt32(S_IFDIR), perm: 0o755, uid: rootOwner.uid,
                                       gid: rootOwner.gid, atimeNs: now, mtimeNs: now, ctimeNs: now)
                try tx.upsert(root)
                t.insert(Node(root))
            }
            t.resident(rootIno)!.parent = rootIno
            // Every directory starts at 2 ("." and its name); subdirectories add to it.
            for n in t.residents { n.nlink = 2 }
            _ = try tx.removeDanglingEntries()
            try tx.eachName { parent, name, ino, isDirectory in
                let dir = t.resident(parent)!  // a folder with a row: `removeDanglingEntries`
                dir.children[name] = ino
                if isDirectory, let child = t.resident(ino) {
                    child.parent = parent
                    dir.nlink += 1
                }
            }
            for (ino, attrs) in try tx.directoryXattrs() { t.resident(ino)?.xattrs = attrs }
            // Inodes with no name left were open-unlinked when the last run ended: gone now.
            dropped = try tx.namelessInodes()
            for ino in dropped {
                try tx.deleteInode(ino)
                t.remove(ino)
            }
            // Content written but not committed before a crash: the cache file is the truth.
            for (ino, size) in try tx.presentFiles() {
                let actual = cache.size(of: ino)
                guard actual != size, var rec = try tx.inode(ino) else { continue }
                let inStore = { () throws -> Bool in
                    guard let up = try tx.uploadState(ino), up.uploadedContentGen == rec.contentGen else { return false }
                    return try tx.entries(of: ino).contains(where: { $0.remoteVersion != nil })
                }
                if actual == nil, try inStore() {
                    // A crash never removes a cache file: someone did. The store has these bytes
                    // (nothing changed here since they went up): a placeholder again, not an empty file.
                    rec.present = false
                    try tx.upsert(rec)
                    lost.append(ino)
                    continue
                }
                if actual != nil, try inStore() {
                    // No write was under way (a write marks the file first): the cache file was
                    // damaged or cut short outside ubiq. The store has the bytes: fetched anew.
                    rec.present = false
                    try tx.upsert(rec)
                    damaged.append(ino)
                    continue
                }
                rec.size = actual ?? 0
                if actual == nil { try cache.createEmpty(ino) }
                rec.contentGen += 1
                try tx.upsert(rec)
                try tx.enqueue(ino)
                repairs.append(rec)
            }
            // (Numbers are never reused within a run: the table numbers past every one it was
            // given. One freed before a restart may be.)
            t.loaded(items: try tx.inodeCount(), presentBytes: try tx.presentBytes(), maxIno: UInt64(try tx.maxInode()))
            kept = try tx.inodeNumbers()
        } }
        for ino in dropped { cache.remove(ino) }
        // Cache files of inodes without rows: a new file whose create returned but no close
        // did before a crash (its rows wait for a transaction: `pendingCreates`).
        let orphans = cache.sweep(keeping: kept)
        if orphans > 0 { logger.info("recycled \(orphans) cache files of items the state database does not have (a crash left them)") }
        for r in repairs { logger.warning("recovered size of inode \(r.ino) from its cache file: \(r.size) bytes") }
        for ino in lost { logger.warning("the cache file of inode \(ino) is gone; its content is in the store: a placeholder again") }
        for ino in damaged {
            cache.remove(ino)
            logger.warning("the cache file of inode \(ino) was changed outside ubiq (its size is not the recorded one); its content is in the store: a placeholder again")
        }
    }

    /// How the inode table reads nodes of files in and which may leave memory (`Inodes`):
    /// `residentLimit` nodes of files stay past those that must (`UBIQ_RESIDENT_NODES` in the
    /// environment overrides it, for tests); `checking` (or `UBIQ_NODE_CHECK=1`) compares each
    /// node that leaves memory with its rows first, and keeps it, with a log line, where they
    /// differ (`nodeCheckFailures`).
    private func setUpNodeSource(residentLimit: Int, checking: Bool) {
        let env = ProcessInfo.processInfo.environment
        let limit = env["UBIQ_RESIDENT_NODES"].flatMap { Int($0) }.map { max(0, $0) } ?? residentLimit
        let checking = checking || env["UBIQ_NODE_CHECK"] == "1"
        inodes.locked { t in
            t.source = NodeSource(
                load: { [unowned self] ino in try readNode(ino) },
                loadChildren: { [unowned self] dir in
                    try state.read { tx in
                        try tx.childFiles(of: dir).map { Node($0.rec, names: $0.names, xattrs: $0.xattrs) }
                    }
                },
                rowsPending: { [unowned self] in Set(pendingCreates.withLock { $0.map(\.ino) }) },
                saveAccessTimes: { [unowned self] nodes in
                    do { try persist { tx in for n in nodes { tx.upsert(n.rec) } } } catch { return false }
                    for n in nodes { n.atimeDirty = false }
                    return true
                },
                check: checking ? { [unowned self] n in nodeMatchesRows(n) } : nil)
            t.residentLimit = limit
        }
    }

    /// The node of a file, link or device node from its rows (nil: none, or a folder).
    private func readNode(_ ino: UInt64) throws -> Node? {
        try state.read { tx -> Node? in
            guard let r = try tx.inode(ino), r.type != UInt32(S_IFDIR) else { return nil }
            return Node(r, names: try tx.nameCount(of: ino), xattrs: try tx.xattrs(ino))
        }
    }

    /// Whether `n` says what its rows say (`UBIQ_NODE_CHECK`); logs where it does not.
    private func nodeMatchesRows(_ n: Node) -> Bool {
        guard let read = try? readNode(n.rec.ino) else {
            logger.error("node check: inode \(n.rec.ino) leaves memory but its rows cannot be read")
            nodeCheckFailures.withLock { $0 += 1 }
            return false
        }
        if read.rec == n.rec && read.nlink == n.nlink && read.xattrs == n.xattrs { return true }
        logger.error("node check: inode \(n.rec.ino) in memory \(n.rec) nlink \(n.nlink) xattrs \(n.xattrs.count) differs from its rows \(read.rec) nlink \(read.nlink) xattrs \(read.xattrs.count)")
        nodeCheckFailures.withLock { $0 += 1 }
        return false
    }

    // MARK: - Helpers

    /// (A `Node` is reached only under the inode table's lock.)
    func attributes(_ n: Node) -> Attributes {
        let r = n.rec
        let size: Int64
        if n.isDirectory { size = 4096 } else if r.type == UInt32(S_IFLNK) { size = Int64(r.target?.count ?? 0) } else { size = r.size }
        // What is really local: a placeholder holds nothing, or what its download has fetched so far.
        let local = (n.isRegular && !r.present) ? (materializer.localBytes(r.ino) ?? 0) : size
        let blocks: Int64 = n.isRegular && r.present ? allocatedBlocks(n) : (local + 511) / 512
        return Attributes(ino: r.ino, mode: r.type | r.perm, nlink: n.nlink, uid: r.uid, gid: r.gid, rdev: r.rdev,
                          size: size, blocks: blocks, atime: r.atimeNs, mtime: r.mtimeNs, ctime: r.ctimeNs)
    }

    /// The 512-byte blocks a file here in full holds (`Node.allocated`), holes left out as the
    /// disk under the cache counts them: measured at a close after writes, else here (once for
    /// each content: a node read in again, a file downloaded).
    private func allocatedBlocks(_ n: Node) -> Int64 {
        let gen = n.rec.contentGen
        if let a = n.allocated, a.contentGen == gen { return a.blocks }
        var st = stat()
        guard stat(cache.path(n.rec.ino), &st) == 0 else { return (n.rec.size + 511) / 512 }
        n.allocated = (gen, Int64(st.st_blocks))
        return Int64(st.st_blocks)
    }

    /// Records the changes `body` makes to the state (`LocalState.record`: in its intent log
    /// when this returns, in the database with the next transaction), after those of new files
    /// that wait. A full disk is ENOSPC, other failures EIO.
    func persist(_ body: (StateChanges) throws -> Void) throws {
        try mappingStateErrors {
            try pendingCreates.withLock { pending in
                let changes = StateChanges(now: state.time.now)
                for p in pending { changes.append(p.changes) }
                try body(changes)
                try state.record(changes.list)
                pending.removeAll()
            }
        }
    }

    /// Runs `body` in a state transaction of its own, for changes that read the database (a
    /// remote change: the recorded ones and those of new files that wait go first). Slower than
    /// `persist`: not for the requests of shell tools.
    func persistNow(_ body: (StateTransaction) throws -> Void) throws {
        try mappingStateErrors {
            try pendingCreates.withLock { pending in
                try state.write { tx in
                    for p in pending { for c in p.changes { try c.apply(tx) } }
                    try body(tx)
                }
                pending.removeAll()
            }
        }
    }

    /// Maps a full disk to ENOSPC and other failures of the state to EIO.
    private func mappingStateErrors(_ body: () throws -> Void) throws {
        do { try body() } catch let e as FSError { throw e } catch let e as StateError {
            logger.error("state write failed: \(e)")
            if case .full = e { throw FSError.noSpace }
            throw FSError.io("\(e)")
        } catch {
            logger.error("state write failed: \(error)")
            throw FSError.io("state database: \(error)")
        }
    }

    /// Claims `inos` through the Coordinator (call without the inode table's lock). `timeout` 0: only if
    /// nobody holds them now (what may be claimed while holding another claim: it never waits).
    func claim(_ inos: [UInt64], _ intent: Intent, timeout: TimeInterval? = nil) throws -> Claim {
        do { return try coordinator.claim(inos, intent, timeout: timeout) } catch {
            if timeout != 0 { logger.warning("\(error)") }
            throw FSError.timedOut
        }
    }

    /// `.ubiquity` at the root is the store's own (the key-value store): nobody makes it.
    static func checkNotReserved(parent: UInt64, name: [UInt8]) throws {
        if parent == 1 && name == ReservedKeys.rootName { throw FSError.notPermitted }
    }

    static func validate(name: [UInt8]) throws {
        if name.isEmpty { throw FSError.notFound }
        if name.count > maxNameBytes { throw FSError.nameTooLong }
        if name.contains(UInt8(ascii: "/")) || name.contains(0) { throw FSError.invalid }
    }

    /// Writes the rows of new files that wait for a transaction (`pendingCreates`) now.
    public func commitPendingCreates() throws {
        if pendingCreates.withLock({ $0.isEmpty }) { return }
        try persist { _ in }
    }

    /// Keeps a new file's rows for the next transaction, which comes half a second on (by the
    /// state's clock) at the latest. Call under the inode table's lock (the file is in the table already).
    /// (A timer scheduled earlier fires earlier: one that is already set keeps the promise.)
    func deferCreate(_ ino: UInt64, _ changes: [StateChange]) {
        pendingCreates.withLock { pending in pending.append((ino, changes)) }
        let arm = pendingCreatesTimer.withLock { armed in
            defer { armed = true }
            return !armed
        }
        guard arm else { return }
        state.time.after(pendingCreatesDelay, on: .global(), execute: DispatchWorkItem { [weak self] in
            self?.pendingCreatesTimer.withLock { $0 = false }
            do { try self?.commitPendingCreates() } catch {
                self?.logger.error("could not write new files' rows: \(error)")
            }
        })
    }

    /// Drops an inode that has no name, no kernel reference and no open handle.
    func reapIfUnreferenced(_ n: Node, _ t: Inodes) {
        guard n.nlink == 0, n.lookups == 0, n.opens == 0, n.rec.ino != rootIno else { return }
        t.remove(n.rec.ino)
        pendingCreates.withLock { pending in pending.removeAll { $0.ino == n.rec.ino } }
        if !n.rowsDeleted {
            do { try state.record([.deleteInode(n.rec.ino)]) } catch {
                logger.error("could not drop inode \(n.rec.ino): \(error)")
            }
        }
        // Nothing can open this cache file any more (the inode is gone, its number is never
        // given again in this run): emptying and pooling it need not hold up the next request.
        if n.isRegular {
            // In batches, a twentieth of a second apart: rm -rf drops a file a request, and a
            // job each woke the recycling thread each time.
            let first = toRecycle.withLock { list in
                list.append(n.rec.ino)
                return list.count == 1
            }
            if first { recycling.asyncAfter(deadline: .now() + 0.05) { [self] in recycleDropped() } }
        }
    }

    /// Pools the cache files of the inodes dropped so far (on `recycling`).
    private func recycleDropped() {
        while true {
            let batch = toRecycle.withLock { list in list }
            if batch.isEmpty { return }
            for ino in batch { cache.recycle(ino) }
            toRecycle.withLock { list in list.removeFirst(batch.count) }
        }
    }

    /// Waits until the cache files of the inodes dropped so far are in the pool (at unmount).
    public func waitForRecycling() { recycling.sync { recycleDropped() } }

    public func isOpenForWriting(_ ino: UInt64) -> Bool {
        // (A node not in memory is neither: `Node.mayLeaveMemory`.)
        inodes.locked { t in t.isBeingWritten(ino) }
    }

    /// Every local change ends here: notes the time (the uploader waits for quiet) and wakes the uploader.
    func kickUploader() {
        lastChange.store(SteadyClock.nanoseconds, ordering: .relaxed)
        uploader?.kick()
    }

    /// A read of a file's bytes: the uploader waits a little for reads to settle too.
    func noteRead() {
        lastRead.store(SteadyClock.nanoseconds, ordering: .relaxed)
    }

    public var secondsSinceLastChange: TimeInterval { Self.seconds(since: lastChange) }
    public var secondsSinceLastRead: TimeInterval { Self.seconds(since: lastRead) }

    private static func seconds(since last: borrowing Atomic<UInt64>) -> TimeInterval {
        // Another thread may record a time between the two reads: never subtract past zero.
        let then = last.load(ordering: .relaxed)
        let now = SteadyClock.nanoseconds
        return now > then ? Double(now - then) / 1e9 : 0
    }

    /// The kernel whose caches of this file system are dropped when content or names change
    /// behind it: the FUSE binding, once it is mounted.
    public func attach(kernel: any KernelNotifier) {
        // A name under a folder the kernel holds no reference to is none it holds (it looked
        // the folder up to hold a name in it, and forgets the folder last): not sent, and
        // 100,000 new files from another device in folders new here cost no notice each.
        let names = KernelNotices<(UInt64, [UInt8])>(name: "ubiq kernel names") { [weak self, weak kernel] n in
            guard let self, let kernel, n.0 == rootIno || self.inodes.locked({ $0.kernelHolds(n.0) }) else { return }
            kernel.invalidateEntry(n.0, n.1)
        }
        let times = noticeTimes
        let contents = KernelNotices<(UInt64, Bool)>(name: "ubiq kernel inodes") { [weak kernel] n in
            kernel?.invalidateInode(n.0, pages: n.1)
            times.sent(n.0)
        }
        channels.withLock {
            self.kernel = kernel
            notices = (names, contents)
        }
    }

    /// The change feed that `ubiq sync` polls and that a waiting remote change asks to poll
    /// again soon. `Engine` attaches it.
    public func attach(feed: any StoreFeed) {
        channels.withLock { self.feed = feed }
    }

    var storeFeed: (any StoreFeed)? { channels.withLock { feed } }

    /// A poll reached the store: downloads that failed while it could not be reached no longer
    /// make their items (and the folders above them) say `error`.
    public func storeAnswered() {
        for ino in materializer.forgetFailuresOfAStoreAway() { emit(.status, ino) }
    }

    /// Asks the kernel to forget `name` in `parent` (added or removed by another device), off
    /// the request path (`KernelNotices`).
    func invalidateKernelEntry(_ parent: UInt64, _ name: [UInt8]) {
        channels.withLock({ notices })?.names.post((parent, name))
    }

    /// Asks the kernel to drop `ino`'s cached pages, off the request path (a handler that
    /// waits for the kernel while the kernel waits for it would deadlock).
    func invalidateKernelCache(_ ino: UInt64) {
        postInodeNotice(ino, pages: true)
    }

    /// Asks the kernel to drop `ino`'s cached attributes (its blocks changed: a download
    /// finished), off the request path. The kernel keeps attributes for `attrTimeout`.
    func invalidateKernelAttributes(_ ino: UInt64) {
        postInodeNotice(ino, pages: false)
    }

    private func postInodeNotice(_ ino: UInt64, pages: Bool) {
        guard let inodes = channels.withLock({ notices?.inodes }) else { return }
        noticeTimes.posted(ino)
        inodes.post((ino, pages))
    }

    /// Tells the kernel binding that folder `ino`'s mode or owner changed (`KernelNotifier.
    /// folderAccessChanged`), before the change is answered.
    func folderAccessChanged(_ ino: UInt64) {
        channels.withLock({ kernel })?.folderAccessChanged(ino)
    }

    // MARK: - Queries

    public func getattr(_ ino: UInt64) throws -> Attributes {
        try inodes.locked { t in attributes(try t.node(ino)) }
    }

    /// Resolves `name` in `parent` and counts one kernel reference to the result.
    /// `waitingForTheListing`: a name not here that the store's listing may still bring (see
    /// `notListedYet`) is looked up again once the listing has passed it (up to
    /// `ChangeFeed.listingWait`).
    public func lookup(_ parent: UInt64, _ name: [UInt8], waitingForTheListing: Bool) throws -> Attributes {
        do { return try lookup(parent, name) } catch FSError.notFound where waitingForTheListing {
            guard let (feed, key) = stillComing(name, in: parent) else { throw FSError.notFound }
            feed.waitForTheListing(toBring: key, seconds: ChangeFeed.listingWait)
            return try lookup(parent, name)
        }
    }

    /// Whether `name`, not found in `parent`, may be in the store still, in the part of its
    /// listing that a device new to it has not brought in yet (`ChangeFeed.mayStillBring`):
    /// a new device's mount answers before a large store's rest is in, and a name looked up
    /// meanwhile is there once the listing reaches it, not "not there" before. The FUSE
    /// binding then answers the lookup from another thread (`waitingForTheListing`).
    public func notListedYet(_ name: [UInt8], in parent: UInt64) -> Bool {
        // Asked at every name not found (each create is one): the folder's path only while a
        // listing fills in.
        guard storeFeed?.fillingIn == true else { return false }
        return stillComing(name, in: parent) != nil
    }

    /// The feed and the store key (bytes, without a folder's "/") of `name` in folder `parent`
    /// where the feed's listing may still bring that key; nil otherwise.
    private func stillComing(_ name: [UInt8], in parent: UInt64) -> (any StoreFeed, [UInt8])? {
        guard let feed = storeFeed, name != [UInt8(ascii: ".")], name != [UInt8(ascii: "."), UInt8(ascii: ".")],
              let folder = pathBytes(of: parent) else { return nil }
        let key = Self.join(folder, name)
        return feed.mayStillBring(key) ? (feed, key) : nil
    }

    /// Resolves `name` in `parent` as it is here now, and counts one kernel reference to the result.
    ///
    /// `.` and `..` come from the kernel only to find an inode by its number, or a folder's
    /// parent (`open_by_handle_at`, an NFS export: the handle is the inode number, which stays
    /// the same across remounts and is never given to another item, `InodeTable.nextIno`):
    /// `.` of any item that still has a name here, else ENOENT, which the kernel answers ESTALE.
    public func lookup(_ parent: UInt64, _ name: [UInt8]) throws -> Attributes {
        if name.count > maxNameBytes { throw FSError.nameTooLong }
        return try inodes.locked { t in
            if name == [UInt8(ascii: ".")] {
                let n = try t.node(parent)
                guard n.nlink > 0 else { throw FSError.notFound }
                n.lookups += 1
                return attributes(n)
            }
            let dir = try t.directory(parent)
            let ino: UInt64
            if name == [UInt8(ascii: ".")] { ino = parent } else if name == [UInt8(ascii: "."), UInt8(ascii: ".")] {
                ino = dir.parent
            } else {
                guard let c = dir.children[name] else { throw FSError.notFound }
                ino = c
            }
            let n = try t.node(ino)
            n.lookups += 1
            return attributes(n)
        }
    }

    /// `name`'s attributes in `parent`, counting no reference (a check before a change).
    public func attributes(of name: [UInt8], in parent: UInt64) throws -> Attributes {
        try inodes.locked { t in
            guard let ino = try t.directory(parent).children[name] else { throw FSError.notFound }
            return attributes(try t.node(ino))
        }
    }

    /// The names in folder `ino` whose items the kernel holds (it looked them up and has not
    /// forgotten them).
    public func heldNames(in ino: UInt64) -> [[UInt8]] {
        inodes.locked { t in
            guard let dir = t.resident(ino) else { return [] }
            return dir.children.compactMap { name, child in (t.resident(child)?.lookups ?? 0) > 0 ? name : nil }
        }
    }

    /// The kernel dropped `count` references to `ino`.
    public func forget(_ ino: UInt64, _ count: UInt64) {
        inodes.locked { t in
            guard let n = t.forget(ino, count) else { return }
            reapIfUnreferenced(n, t)
        }
    }

    public func readlink(_ ino: UInt64) throws -> [UInt8] {
        try inodes.locked { t in
            let n = try t.node(ino)
            guard n.rec.type == UInt32(S_IFLNK), let t = n.rec.target else { throw FSError.invalid }
            return t
        }
    }

    /// df: the store's quota and usage where the store has a quota (as last seen by the
    /// uploader; never waits for the store), otherwise the disk that holds the cache.
    public func statfs() -> FSStats {
        var s = statvfs()
        _ = statvfs(cache.directory.path, &s)
        let files = UInt64(inodes.locked { t in t.items })
        if let u = uploader?.storeUsage, let quota = u.quotaBytes {
            let bs: UInt64 = 4096
            let total = UInt64(max(0, quota)) / bs
            let free = UInt64(max(0, quota - u.usedBytes)) / bs
            return FSStats(blockSize: bs, blocks: total, blocksFree: free, blocksAvailable: free,
                           files: files + UInt64(s.f_ffree), filesFree: UInt64(s.f_ffree), nameMax: UInt64(maxNameBytes))
        }
        return FSStats(blockSize: UInt64(s.f_bsize), blocks: UInt64(s.f_blocks), blocksFree: UInt64(s.f_bfree),
                       blocksAvailable: UInt64(s.f_bavail), files: files + UInt64(s.f_ffree),
                       filesFree: UInt64(s.f_ffree), nameMax: UInt64(maxNameBytes))
    }

    /// access(2): with `default_permissions` the kernel checks modes itself; without it the
    /// kernel asks here (access, chdir), and this makes ext4's check (`PermissionRules`).
    public func access(_ ino: UInt64, mask: Int32, who: Credentials) throws {
        let a = try getattr(ino)
        if mask == F_OK { return }
        try PermissionRules.require(UInt32(mask & 7), PermissionRules.Item(a), who)
    }

    // MARK: - For tests and the daemon

    /// Makes every change durable on disk, new files' rows included (fsyncdir, sync).
    public func syncState() throws {
        try commitPendingCreates()
        state.syncToDisk()
    }

    /// Number of items (inodes), in memory or not.
    public var inodeCount: Int { inodes.locked { t in t.items } }

    /// Number of inodes in memory (`Inodes`), and how many left memory so far.
    public var residentNodes: (count: Int, evicted: Int) { inodes.locked { t in (t.residentCount, t.evictions) } }

    /// The kernel's current lookup count of `ino` (tests check forget accounting).
    public func lookupCount(_ ino: UInt64) -> UInt64? { inodes.locked { t in t[ino]?.lookups } }
}
