import Foundation
import Synchronization
import UbiqState

/// The inode table: the inodes in memory and every open handle, behind one lock.
///
/// Its contents (`Inodes`) are reachable only through `locked`, which holds the lock for the
/// length of the closure; a function that takes an `Inodes` is thus one that runs with the lock
/// held, and the compiler says so (where the code used to say "call with `lock` held").
///
/// Not every inode is in memory (docs/architecture.md, "Inodes in memory"): every folder is, with
/// its names; a file, link or device node is while something needs it there (open, written and
/// not yet committed, its rows not yet written, an access time to write, no name left) or was
/// used lately (at most `residentLimit` of them), and is read from the state database again when
/// asked for (`subscript`, `node`). A number the kernel holds needs no node: its count of kernel
/// references is kept without one.
///
/// LOCK ORDER (docs/architecture.md): Coordinator claims first, then this lock, then the
/// Materializer's, then the state database. Never wait for a claim, a download or the store
/// while holding it. Pure metadata reads (lookup, getattr, readdir, getxattr) read the table
/// under it and take no claim, so `stat` never waits behind a download.
final class InodeTable: @unchecked Sendable {
    private let lock = NSLock()
    private let contents = Inodes()

    /// Runs `body` with the lock held. `body` must not keep the `Inodes` it is given (nor any
    /// `Node`: one may leave memory when the lock is given up, `Inodes.trim`).
    func locked<T>(_ body: (Inodes) throws -> T) rethrows -> T {
        lock.lock()
        defer {
            contents.trim()
            lock.unlock()
        }
        return try body(contents)
    }
}

/// How the inode table reads a node from the state database and tells which may leave memory
/// (`FileSystem` sets it up, before anything else uses the table).
struct NodeSource {
    /// The node of a file, link or device node from the state database (nil: no such inode,
    /// or a folder: folders are always in memory). Its `nlink` and `xattrs` filled in.
    var load: (UInt64) throws -> Node?
    /// The nodes of the files, links and device nodes in a folder, in one read.
    var loadChildren: (UInt64) throws -> [Node]
    /// Inodes whose rows are not in the state database yet (`FileSystem.pendingCreates`).
    var rowsPending: () -> Set<UInt64>
    /// Records the access times of nodes about to leave memory (`Node.atimeDirty`); false:
    /// they could not be, and stay.
    var saveAccessTimes: ([Node]) -> Bool
    /// Checks a node against its rows before it leaves memory (tests: `UBIQ_NODE_CHECK`);
    /// false keeps it in memory.
    var check: ((Node) -> Bool)?
}

/// What the inode table holds, handed out only under its lock (`InodeTable.locked`).
final class Inodes {
    private var nodes: [UInt64: Node] = [:]
    /// Kernel references of inodes not in memory (a node leaving memory leaves its count here).
    private var heldRefs = HeldReferences()
    private var handles: [UInt64: Handle] = [:]
    private var nextHandle: UInt64 = 1
    /// The number the next new inode gets: never one given before in this run.
    private(set) var nextIno: UInt64 = 2
    /// Counts uses of content, for least-recently-used order (`touch`).
    private var useClock: UInt64 = 0
    /// Counts every reach of a node, for which ones leave memory first (`Node.lastSeen`).
    private var seenClock: UInt64 = 0
    /// Counts replacements of content by a remote version (`Node.contentEpoch`). A node read in
    /// again gets the count as its epoch: equal to the one it had unless some content was
    /// replaced meanwhile (then an open in progress starts over once, needlessly at worst).
    private var epochClock = 0
    var source = NodeSource(load: { _ in nil }, loadChildren: { _ in [] }, rowsPending: { [] }, saveAccessTimes: { _ in false }, check: nil)
    /// How many nodes of files (not folders) stay in memory past those that must.
    var residentLimit = Int.max { didSet { trimAbove = residentLimit } }
    /// Nodes of files in memory; a trim comes when there are more than `trimAbove`.
    private var residentFiles = 0
    private var trimAbove = Int.max
    /// Nodes that left memory so far (what tests look at).
    private(set) var evictions = 0

    fileprivate init() {}

    // MARK: Inodes

    /// The inode `ino`, from memory or from the state database (nil: none; also when the
    /// database cannot be read, which `node` says instead).
    subscript(ino: UInt64) -> Node? { try? node(ino) }

    func node(_ ino: UInt64) throws -> Node {
        if let n = nodes[ino] {
            seenClock &+= 1
            n.lastSeen = seenClock
            return n
        }
        let loaded: Node?
        do { loaded = try source.load(ino) } catch { throw FSError.io("state database: \(error)") }
        guard let n = loaded else { throw FSError.notFound }
        readIn(n)
        return n
    }

    /// Reads the nodes of the folder `dir`'s files in at once, when some are not in memory and
    /// they fit well within `residentLimit` (a listing with attributes, `readdirplus`, asks for
    /// every one next: one read instead of one each). Left to `node` when the read fails.
    func readInChildren(of dir: Node) {
        guard dir.children.count <= residentLimit / 2,
              dir.children.values.contains(where: { nodes[$0] == nil }),
              let read = try? source.loadChildren(dir.rec.ino) else { return }
        for n in read where nodes[n.rec.ino] == nil { readIn(n) }
    }

    /// Puts a node read from its rows into memory, with the kernel's references it had.
    private func readIn(_ n: Node) {
        n.lookups = heldRefs.removeValue(forKey: n.rec.ino) ?? 0
        admit(n)
    }

    /// The node of `ino` if it is in memory (never reads the database).
    func resident(_ ino: UInt64) -> Node? { nodes[ino] }

    /// Whether the kernel holds a reference to `ino` (it looked it up and has not forgotten it).
    func kernelHolds(_ ino: UInt64) -> Bool { (nodes[ino]?.lookups ?? heldRefs[ino] ?? 0) > 0 }

    /// Whether `ino` is open. A node not in memory is not: an open one never leaves.
    func isOpen(_ ino: UInt64) -> Bool { (nodes[ino]?.opens ?? 0) > 0 }

    /// Whether `ino` is being written or has writes not yet committed (neither leaves memory).
    func isBeingWritten(_ ino: UInt64) -> Bool { nodes[ino].map { $0.writers > 0 || $0.unpersisted } ?? false }

    func directory(_ ino: UInt64) throws -> Node {
        let n = try node(ino)
        guard n.isDirectory else { throw FSError.notDirectory }
        return n
    }

    /// Whether the folder `dir` is `ancestor` or below it (a folder may not move there).
    func isInside(_ dir: UInt64, _ ancestor: UInt64) -> Bool {
        var p = dir
        while true {
            if p == ancestor { return true }
            if p == rootIno { return false }
            p = nodes[p]?.parent ?? rootIno
        }
    }

    /// The inodes in memory (every folder; files only as `Inodes` says).
    var residents: Dictionary<UInt64, Node>.Values { nodes.values }
    /// Every inode there is, in memory or not.
    private(set) var items = 0
    /// Inodes in memory.
    var residentCount: Int { nodes.count }

    /// Adds a new inode (or one loaded at mount), counting it among the items.
    func insert(_ n: Node) {
        remove(n.rec.ino)
        admit(n)
        items += 1
        tally.bytes = tally.bytes &+ Node.localBytes(n.rec)
        nextIno = max(nextIno, n.rec.ino + 1)
    }

    /// Drops an inode that is gone (its number is not given again in this run). `ino` must
    /// be in memory (`reapIfUnreferenced` has its node).
    func remove(_ ino: UInt64) {
        heldRefs[ino] = nil
        guard let n = nodes.removeValue(forKey: ino) else { return }
        items -= 1
        if !n.isDirectory { residentFiles -= 1 }
        tally.bytes = tally.bytes &- Node.localBytes(n.rec)
        n.tally = nil
    }

    /// Sets what the mount found in the state database: how many items, how many bytes
    /// present, the highest number given.
    func loaded(items: Int, presentBytes: Int64, maxIno: UInt64) {
        self.items = items
        tally.bytes = presentBytes
        nextIno = max(nextIno, maxIno + 1)
    }

    /// Puts a node into memory, not counting it as new.
    private func admit(_ n: Node) {
        n.contentEpoch = epochClock
        seenClock &+= 1
        n.lastSeen = seenClock
        n.tally = tally
        nodes[n.rec.ino] = n
        if !n.isDirectory { residentFiles += 1 }
    }

    /// The kernel dropped `count` references to `ino`. Its node, if it is in memory (one that
    /// is not has a name and nothing open: nothing to reap).
    func forget(_ ino: UInt64, _ count: UInt64) -> Node? {
        if let n = nodes[ino] {
            n.lookups = n.lookups >= count ? n.lookups - count : 0
            // A kernel that holds the inode no more holds no size of it: its next lookup learns it.
            if n.lookups == 0 { n.kernelSizeStale = false }
            return n
        }
        if let held = heldRefs[ino] { heldRefs[ino] = held > count ? held - count : nil }
        return nil
    }

    /// A new content epoch for `n` (its content was replaced: an open in progress starts over).
    func replacedContent(_ n: Node) {
        epochClock += 1
        n.contentEpoch = epochClock
        n.kernelSizeStale = true
        n.allocated = nil
    }

    /// Lets the least recently seen nodes of files go from memory, past `residentLimit`, of
    /// those that may (`Node.mayLeaveMemory`). Runs as the lock is given up; amortized: when
    /// none may go, the next try waits for a quarter of the limit more.
    fileprivate func trim() {
        guard residentFiles > trimAbove else { return }
        let pending = source.rowsPending()
        var out = nodes.values.filter { $0.mayLeaveMemory && !pending.contains($0.rec.ino) }
        let goal = residentLimit - residentLimit / 4
        let excess = residentFiles - goal
        if out.count > excess {
            // The `excess` least recently seen, found by sorting their times alone: sorting
            // the nodes (two retains and releases a comparison) was most of a trim, and trims
            // were a sixth of a large listing's import.
            var times = out.map(\.lastSeen)
            times.sort()
            let cut = excess > 0 ? times[excess - 1] : 0
            var chosen = out.filter { $0.lastSeen < cut }
            for n in out where n.lastSeen == cut && chosen.count < excess { chosen.append(n) }
            out = chosen
        }
        let touched = out.filter(\.atimeDirty)
        if !touched.isEmpty && !source.saveAccessTimes(touched) { out.removeAll(where: \.atimeDirty) }
        for n in out where source.check?(n) ?? true {
            nodes[n.rec.ino] = nil
            residentFiles -= 1
            n.tally = nil
            if n.lookups > 0 { heldRefs[n.rec.ino] = n.lookups }
            evictions += 1
        }
        trimAbove = max(residentLimit, residentFiles + residentLimit / 4)
    }

    /// The bytes of content held here in full: every present regular file's size, kept as
    /// records change (`Node.rec`) and items come and go, so the cache limit's check walks
    /// nothing. (A node leaving memory or read in again changes nothing.)
    var presentBytes: Int64 { tally.bytes }
    private let tally = ContentTally()

    /// Puts a new inode in memory under `name` in `dir`, counting links both ways.
    @discardableResult
    func attach(_ rec: InodeRecord, in dir: Node, name: [UInt8]) -> Node {
        let n = Node(rec)
        if n.isDirectory {
            n.parent = dir.rec.ino
            n.nlink = 2
            dir.nlink += 1
        } else {
            n.nlink = 1
        }
        insert(n)
        dir.children[name] = rec.ino
        return n
    }

    /// Inodes under (and including) `ino` (from the folders' names: reads no file's node).
    func subtree(_ ino: UInt64) -> [UInt64] {
        var out: [UInt64] = []
        var stack = [ino]
        while let i = stack.popLast() {
            out.append(i)
            if let n = nodes[i], n.isDirectory { stack.append(contentsOf: n.children.values) }
        }
        return out
    }

    /// Records a use of `n`'s content (least-recently-used order for eviction).
    func touch(_ n: Node) {
        useClock += 1
        n.lastUsed = useClock
    }

    // MARK: Handles

    /// Registers an open handle; returns its number.
    func add(_ h: Handle) -> UInt64 {
        let fh = nextHandle
        nextHandle += 1
        handles[fh] = h
        return fh
    }

    func handle(_ fh: UInt64) -> Handle? { handles[fh] }

    func removeHandle(_ fh: UInt64) -> Handle? { handles.removeValue(forKey: fh) }
}

/// One inode in memory. Reached only under the inode table's lock.
final class Node {
    var rec: InodeRecord {
        didSet { if let tally { tally.bytes = tally.bytes &+ (Self.localBytes(rec) &- Self.localBytes(oldValue)) } }
    }
    /// The table's count of local content this node adds to while it is in the table.
    fileprivate var tally: ContentTally?
    /// What a record holds locally, in full: a present regular file's size.
    static func localBytes(_ r: InodeRecord) -> Int64 { r.present && r.type == UInt32(S_IFREG) ? r.size : 0 }
    var nlink: UInt32 = 0
    /// Directories: the parent directory (root: itself).
    var parent: UInt64 = 0
    /// Directories: name → inode.
    var children = FolderNames() { didSet { conflictIndex = nil } }
    /// Directories: the conflict copies among `children`, by the name they were made for
    /// (worked out when asked, dropped when `children` changes).
    var conflictIndex: [[UInt8]: [[UInt8]]]?
    /// The kernel's lookup count (lookup, create, readdirplus add; forget subtracts).
    var lookups: UInt64 = 0
    var opens = 0
    var writers = 0
    var xattrs: [[UInt8]: [UInt8]] = [:]
    /// Content or size changed in memory and not yet committed (close/fsync commit).
    var unpersisted = false
    /// Its rows are gone from the state database already: its last name was removed while
    /// nothing had it open (the kernel may still hold it until `forget`, from memory).
    var rowsDeleted = false
    /// Removing the name it is being removed by leaves it with none, and nothing has it open:
    /// its rows can go in the same transaction (`rowsDeleted`).
    var losesRowsWithThisName: Bool { (isDirectory || nlink <= 1) && opens == 0 }
    /// When the content was last opened (`Inodes.touch`, for least-recently-used eviction; 0
    /// for a node read in again: its files are the first the cache limit evicts).
    var lastUsed: UInt64 = 0
    /// When the node was last reached (`Inodes.node`): which nodes leave memory first.
    var lastSeen: UInt64 = 0
    /// atime changed by a read and not written yet (see `writeAccessTimes`).
    var atimeDirty = false
    /// 512-byte blocks the cache file holds, as measured for the content of `contentGen` (at a
    /// close after writes, a fallocate, or when asked: `FileSystem.allocatedBlocks`): `st_blocks`
    /// tells of holes. Nil once another content came (a version from another device, an eviction).
    var allocated: (contentGen: Int64, blocks: Int64)?
    /// Changes when the content is replaced by a remote version (an open in progress starts
    /// over), and when the node is read in again (`Inodes.replacedContent`, `admit`).
    fileprivate(set) var contentEpoch = 0
    /// The kernel may hold a size other than the file's (another device's version came in, an
    /// append came at another end), until it keeps the answer to a lookup or forgets the inode
    /// (`FileSystem.kernelSizeAtOpen`).
    var kernelSizeStale = false {
        didSet { if kernelSizeStale != oldValue { Node.staleSizes.wrappingAdd(kernelSizeStale ? 1 : -1, ordering: .relaxed) } }
    }
    /// How many nodes in memory, of every file system in the process, have `kernelSizeStale`
    /// set: while none has, an entry the kernel takes needs no look at its node
    /// (`FileSystem.kernelLookedUp`).
    static let staleSizes = Atomic<Int>(0)
    /// When an open was last sent back to look again (`SteadyClock.nanoseconds`; 0: never).
    var lookAgainAsked: UInt64 = 0

    /// Whether it may leave memory and be read from its rows again when asked for: nothing
    /// about it lives only here but an access time, which is recorded as it leaves. (Folders
    /// never leave: their names are the tree.)
    var mayLeaveMemory: Bool {
        !isDirectory && nlink > 0 && opens == 0 && writers == 0 && !unpersisted && !rowsDeleted && !kernelSizeStale
    }

    init(_ rec: InodeRecord) { self.rec = rec }

    deinit { if kernelSizeStale { Node.staleSizes.wrappingSubtract(1, ordering: .relaxed) } }

    /// The node of a file, link or device node as its rows say: its record, how many names it
    /// has, its xattrs.
    convenience init(_ rec: InodeRecord, names: Int, xattrs: [[UInt8]: [UInt8]]) {
        self.init(rec)
        nlink = UInt32(names)
        self.xattrs = xattrs
    }
    var isDirectory: Bool { rec.type == UInt32(S_IFDIR) }
    var isRegular: Bool { rec.type == UInt32(S_IFREG) }

    /// Clears setuid, and setgid if the group may execute or the caller is not in the file's
    /// group (`inGroup`; without group execute, setgid marks mandatory locking), as the kernel
    /// does on ext4 for a write, a truncation or a chown by a caller without CAP_FSETID
    /// (`setattr_should_drop_sgid`). Whether the mode changed (its ctime is the caller's).
    func clearSetID(inGroup: (UInt32) -> Bool) -> Bool {
        var perm = rec.perm & ~UInt32(S_ISUID)
        if perm & UInt32(S_ISGID) != 0 && (perm & UInt32(S_IXGRP) != 0 || !inGroup(rec.gid)) { perm &= ~UInt32(S_ISGID) }
        guard perm != rec.perm else { return false }
        rec.perm = perm
        rec.metaGen += 1
        return true
    }
}

/// The sum of `Node.localBytes` over the nodes of one table (under its lock). Wrapping sums:
/// a record may say any size for a moment (a store's, before it is checked) without a trap,
/// and the sum is right again once it says what it holds.
final class ContentTally {
    var bytes: Int64 = 0
}

/// An open file or directory.
final class Handle {
    let ino: UInt64
    /// The cache file, for regular files; -1 otherwise.
    let fd: Int32
    let flags: Int32
    /// Directories: the listing taken at opendir, so readdir is stable while the directory
    /// changes; taken again when a read starts over from 0 (`rewinddir`).
    var listing: [DirEntry] = []
    /// Directories: whether readdir has answered from `listing` yet.
    var listingRead = false
    init(ino: UInt64, fd: Int32, flags: Int32) { self.ino = ino; self.fd = fd; self.flags = flags }
    var canWrite: Bool { (flags & O_ACCMODE) != O_RDONLY }
}
