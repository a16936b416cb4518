import Foundation
import UbiqState

/// The inode table: every inode and open handle in memory, behind one lock.
///
/// Its contents (`Inodes`) are reachable only through `locked`, which holds the lock for the
/// length of the closure; a function that takes an `Inodes` is thus one that runs with the lock
/// held, and the compiler says so (where the code used to say "call with `lock` held").
///
/// LOCK ORDER (docs/architecture.md): Coordinator claims first, then this lock, then the
/// Materializer's, then the state database. Never wait for a claim, a download or the store
/// while holding it. Pure metadata reads (lookup, getattr, readdir, getxattr) read the table
/// under it and take no claim, so `stat` never waits behind a download.
final class InodeTable: @unchecked Sendable {
    private let lock = NSLock()
    private let contents = Inodes()

    /// Runs `body` with the lock held. `body` must not keep the `Inodes` it is given.
    func locked<T>(_ body: (Inodes) throws -> T) rethrows -> T {
        lock.lock(); defer { lock.unlock() }
        return try body(contents)
    }
}

/// What the inode table holds, handed out only under its lock (`InodeTable.locked`).
final class Inodes {
    private var nodes: [UInt64: Node] = [:]
    private var handles: [UInt64: Handle] = [:]
    private var nextHandle: UInt64 = 1
    /// The number the next new inode gets: never one given before in this run.
    private(set) var nextIno: UInt64 = 2
    /// Counts uses of content, for least-recently-used order (`touch`).
    private var useClock: UInt64 = 0

    fileprivate init() {}

    // MARK: Inodes

    subscript(ino: UInt64) -> Node? { nodes[ino] }

    func node(_ ino: UInt64) throws -> Node {
        guard let n = nodes[ino] else { throw FSError.notFound }
        return n
    }

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

    /// Every inode in memory.
    var all: Dictionary<UInt64, Node>.Values { nodes.values }
    var count: Int { nodes.count }

    /// Adds an inode (loaded from the state database, or new).
    func insert(_ n: Node) {
        remove(n.rec.ino)
        nodes[n.rec.ino] = n
        n.tally = tally
        tally.bytes = tally.bytes &+ Node.localBytes(n.rec)
        nextIno = max(nextIno, n.rec.ino + 1)
    }

    /// Drops an inode from memory (its number is not given again in this run).
    func remove(_ ino: UInt64) {
        guard let n = nodes.removeValue(forKey: ino) else { return }
        tally.bytes = tally.bytes &- Node.localBytes(n.rec)
        n.tally = nil
    }

    /// The bytes of content held here in full: every present regular file's size, kept as
    /// records change (`Node.rec`), so the cache limit's check does not walk every inode.
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

    /// Inodes under (and including) `ino`.
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
    var children: [[UInt8]: UInt64] = [:] { didSet { conflictIndex = nil } }
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
    /// When the content was last opened (`Inodes.touch`, for least-recently-used eviction).
    var lastUsed: UInt64 = 0
    /// atime changed by a read and not written yet (see `writeAccessTimes`).
    var atimeDirty = false
    /// Counts replacements of the content by a remote version (an open in progress starts over).
    var contentEpoch = 0

    init(_ rec: InodeRecord) { self.rec = rec }
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
    /// Directories: the listing taken at opendir, so readdir is stable while the directory changes.
    var listing: [DirEntry] = []
    init(ino: UInt64, fd: Int32, flags: Int32) { self.ino = ino; self.fd = fd; self.flags = flags }
    var canWrite: Bool { (flags & O_ACCMODE) != O_RDONLY }
}
