import Foundation
import GRDB
import Synchronization
import UbiqClock

/// The wall clock, nanoseconds since the epoch (file times).
public func nowNanos() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

/// One inode as the device remembers it.
public struct InodeRecord: Sendable, Equatable {
    public var ino: UInt64
    /// File type, as `st_mode & S_IFMT`.
    public var type: UInt32
    /// Permission bits, the low 12 bits of `st_mode`.
    public var perm: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var size: Int64
    public var atimeNs: Int64
    public var mtimeNs: Int64
    public var ctimeNs: Int64
    public var rdev: UInt64
    public var target: [UInt8]?
    /// The content is in the cache (false: a placeholder).
    public var present: Bool
    /// Bumped on every content change; the upload records the one it sent.
    public var contentGen: Int64
    /// Bumped on every metadata change (mode, owner, times, xattrs).
    public var metaGen: Int64
    /// "Keep downloaded": fetched ahead, never evicted (on a folder: everything under it).
    public var pinned: Bool = false

    public init(ino: UInt64, type: UInt32, perm: UInt32, uid: UInt32, gid: UInt32, size: Int64 = 0,
                atimeNs: Int64, mtimeNs: Int64, ctimeNs: Int64, rdev: UInt64 = 0, target: [UInt8]? = nil,
                present: Bool = true, contentGen: Int64 = 1, metaGen: Int64 = 1) {
        self.ino = ino; self.type = type; self.perm = perm; self.uid = uid; self.gid = gid
        self.size = size; self.atimeNs = atimeNs; self.mtimeNs = mtimeNs; self.ctimeNs = ctimeNs
        self.rdev = rdev; self.target = target; self.present = present
        self.contentGen = contentGen; self.metaGen = metaGen
    }
}

/// One name of an inode in a directory, and where it lives in the store.
public struct EntryRecord: Sendable, Equatable {
    public var id: Int64
    public var parent: UInt64
    public var name: [UInt8]
    public var ino: UInt64
    /// The key this entry's object has in the store (nil: never uploaded).
    public var remoteKey: String?
    public var remoteVersion: String?
    /// The store's content tag of that version (see `ObjectInfo.contentTag`).
    public var remoteTag: String? = nil
    /// The SHA-256 written beside that version's bytes (`ObjectMetadata.sha256`): a download
    /// of it is checked against this.
    public var remoteDigest: String? = nil
    /// The item's id in the store (`ObjectMetadata.fileID`): the one the version it records
    /// carried, kept when the entry leaves the store's key (its next upload carries it again).
    public var remoteFileID: String? = nil
}

/// What the uploader has yet to do for an inode.
public struct UploadState: Sendable, Equatable {
    public var uploadedContentGen: Int64
    public var uploadedMetaGen: Int64
    public var error: String?
    /// The last upload met another device's newer version (the error says which).
    public var conflict = false
    /// Kept on this device only, by design (a name the store cannot hold; the error says why).
    public var localOnly = false
}

public enum StateError: Error, CustomStringConvertible {
    case database(String)
    /// The disk under the database is full, and its reserve is spent.
    case full(String)
    public var description: String {
        switch self {
        case .database(let s): return "state database: \(s)"
        case .full(let s): return "state database: the disk is full (\(s))"
        }
    }
}

/// The device's truth: a SQLite database (WAL) of inodes, names, xattrs,
/// the outbox and cursors. `synchronous = NORMAL` makes every commit survive
/// a killed process, and so does `record`, which puts a request's changes in the
/// intent log for the next transaction to apply (RecordedChanges.swift);
/// `syncToDisk()` makes everything committed or recorded so far survive a power
/// loss too (it applies what was recorded and fsyncs the WAL), and is called by fsync.
public final class LocalState: Sendable {
    public let path: String
    /// The time upload delays and retries go by (`StateTransaction.now`, `StateChanges`).
    public let time: any TimeSource
    /// Space kept on the disk for this database's commits (DiskReserve).
    public let reserve: DiskReserve
    let dbQueue: DatabaseQueue
    private let walFD: Int32
    /// The recorded changes not yet in the database (nil in memory: they wait in `pending` only).
    let intents: IntentLog?
    let pending: Mutex<Pending>
    /// Held by every transaction, across the database's and `applied`: so no two apply the same
    /// recorded changes. `record` does not take it, so a request never waits for an apply.
    let writeLock = NSLock()
    /// The last recorded change in the database (under `writeLock`).
    nonisolated(unsafe) var applied: UInt64 = 0
    /// How long recorded changes wait for a transaction before one is made for them.
    public let applyDelay: TimeInterval
    /// Bytes the intent log may hold before it starts again with only what is not applied.
    let intentLogLimit: Int64
    let applier = DispatchQueue(label: "ubiq.state.apply")
    /// Told what went wrong in the background (a recorded change the database refused).
    let report: @Sendable (String) -> Void

    struct Pending {
        var batches: [(seq: UInt64, changes: [StateChange])] = []
        var nextSeq: UInt64 = 1
    }

    /// Opens (creating and migrating) the database at `path`. `exclusive`: this
    /// process is the only one to open it until it closes it (the daemon). `freeBytes`: the
    /// free space of its disk, for the reserve (tests give a disk of their own).
    public init(path: String, exclusive: Bool = false,
                freeBytes: @escaping @Sendable (String) -> Int64? = DiskReserve.freeBytes(at:),
                applyDelay: TimeInterval = 0.05, intentLogLimit: Int64 = 4 << 20, time: any TimeSource = SystemTime(),
                report: @escaping @Sendable (String) -> Void = { _ in }) throws {
        self.path = path
        self.time = time
        self.applyDelay = applyDelay
        self.intentLogLimit = intentLogLimit
        self.report = report
        pending = Mutex(Pending())
        reserve = DiskReserve(path: path + ".reserve", bytes: Self.reserveBytes, freeBytes: freeBytes)
        var config = Configuration()
        config.busyMode = .timeout(5)
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            // Only the daemon holding the state lock opens this database: no need for
            // SQLite's per-transaction file locks.
            if exclusive { _ = try String.fetchOne(db, sql: "PRAGMA locking_mode = EXCLUSIVE") }
        }
        // The owner's alone, its -wal and -shm too (SQLite gives them the database file's mode).
        if access(path, F_OK) != 0 { close(open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)) }
        for f in [path, path + "-wal", path + "-shm"] { chmod(f, 0o600) }
        do {
            dbQueue = try DatabaseQueue(path: path, configuration: config)
            try dbQueue.writeWithoutTransaction { db in
                _ = try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL")
            }
            try Self.migrator.migrate(dbQueue)
        } catch {
            throw StateError.database("cannot open \(path): \(error)")
        }
        walFD = open(path + "-wal", O_RDONLY | O_CLOEXEC)
        intents = try IntentLog(path: path + "-intents")
        for f in [path, path + "-wal", path + "-shm"] { chmod(f, 0o600) }
        try recover()
    }

    deinit { if walFD >= 0 { close(walFD) } }

    /// An in-memory database, for tests.
    public init() throws {
        path = ":memory:"
        time = SystemTime()
        reserve = DiskReserve(path: nil)
        applyDelay = 0.05
        intentLogLimit = 0
        report = { _ in }
        pending = Mutex(Pending())
        dbQueue = try DatabaseQueue()
        try Self.migrator.migrate(dbQueue)
        walFD = -1
        intents = nil
    }


    // MARK: - Transactions

    /// Runs `body` in one write transaction. A disk too full for it, even after the reserve
    /// was given up, is `StateError.full`.
    /// The recorded changes go first (`record`), in the same transaction.
    public func write<T>(_ body: (StateTransaction) throws -> T) throws -> T {
        writeLock.lock(); defer { writeLock.unlock() }
        do {
            return try transaction(body)
        } catch let e as DatabaseError where e.resultCode == .SQLITE_FULL {
            // The disk is full: the reserve makes room for this commit (and the next few).
            guard reserve.release() else { throw StateError.full("\(e)") }
            do { return try transaction(body) } catch let e as DatabaseError where e.resultCode == .SQLITE_FULL {
                throw StateError.full("\(e)")
            } catch {
                throw StateError.database("\(error)")
            }
        } catch let e as StateError { throw e } catch {
            throw StateError.database("\(error)")
        }
    }

    /// One transaction: the recorded changes the database lacks, then `body` (under `writeLock`).
    private func transaction<T>(_ body: (StateTransaction) throws -> T) throws -> T {
        var last: UInt64?
        let result = try dbQueue.write { db in
            let tx = StateTransaction(db: db, now: time.now)
            last = try applyRecorded(tx)
            return try body(tx)
        }
        if let last { markApplied(last) }
        return result
    }

    /// Space held beside the database so that it can still commit when the disk fills up.
    public static let reserveBytes: Int64 = 8 << 20

    /// Reads what was recorded too: the recorded changes are applied first.
    public func read<T>(_ body: (StateTransaction) throws -> T) throws -> T {
        try applyRecordedNow()
        do {
            // A transaction of its own, not GRDB's `read`: that one sets `PRAGMA query_only` on
            // and off around each read, and SQLite expires every prepared statement when a flag
            // pragma changes, so each cached statement was compiled again after every read
            // (a third of a large listing's import went to it). This connection is the only
            // one, and what reads here does not write.
            var result: T?
            try dbQueue.unsafeRead { db in
                try db.inTransaction(.deferred) {
                    result = try body(StateTransaction(db: db, now: time.now))
                    return .commit
                }
            }
            return result!
        } catch let e as DatabaseError {
            throw StateError.database("\(e)")
        }
        // Anything else the body threw is its own answer, and passes as it is.
    }

    /// Makes every committed transaction durable against power loss.
    public func syncToDisk() {
        syncs.withLock { $0 += 1 }
        do { try applyRecordedNow() } catch {
            // Still in the intent log: that file is made durable instead.
            pending.withLock { _ in intents?.sync() }
        }
        if walFD >= 0 { _ = fdatasync(walFD) }
    }

    /// How many times `syncToDisk` ran (what tests of the durability contract count).
    public var syncCount: Int { syncs.withLock { $0 } }
    private let syncs = Mutex(0)
}
