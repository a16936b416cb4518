import Foundation
import Synchronization
import UbiqState
import UbiqStore
import CUbiq

/// The local content of files: one cache file per inode, named by inode
/// number (never by a store name, so no store name can reach outside it).
/// Directory mode 0700, files 0600.
public final class ContentCache: Sendable {
    public let directory: URL
    public let staging: URL
    /// Empty cache files of deleted files, kept to be the cache files of new ones (see `recycle`).
    public let pool: URL
    /// The state database's reserve on the same disk: staging copies may not use its space.
    public let reserve: DiskReserve?
    private let spare: Mutex<Spare>
    /// `directory` and `pool` as paths ending in "/", made once: `URL.path` computes its
    /// answer anew on each call, which was most of the cost of a new file's cache file.
    private let prefix: String
    private let poolPrefix: String

    /// The pool's names, and the cache files that downloads hold open (never recycled).
    private struct Spare {
        var names: [UInt64] = []
        var next: UInt64 = 0
        var held: [UInt64: Int] = [:]
    }

    /// At most this many empty files wait in the pool (an inode each, no blocks).
    public let poolLimit: Int

    public init(directory: URL, reserve: DiskReserve? = nil, poolLimit: Int = 16_384) throws {
        self.directory = directory
        self.poolLimit = poolLimit
        self.staging = directory.appendingPathComponent(".staging")
        self.pool = directory.appendingPathComponent(".pool")
        self.reserve = reserve
        self.prefix = directory.path + "/"
        self.poolPrefix = pool.path + "/"
        for d in [staging, pool] {
            try FileManager.default.createDirectory(at: d, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
        }
        chmod(directory.path, 0o700)
        Self.clearStaging(in: directory)
        // The pool a previous run left: its files are empty (truncated before they went in).
        var spare = Spare()
        for f in (try? FileManager.default.contentsOfDirectory(atPath: pool.path)) ?? [] {
            if let n = UInt64(f), spare.names.count < poolLimit {
                spare.names.append(n)
                spare.next = max(spare.next, n + 1)
            } else {
                unlink(poolPrefix + f)
            }
        }
        self.spare = Mutex(spare)
    }

    /// Staging copies are only for uploads in flight: a new run starts without them. The daemon
    /// calls this before it opens the state database, so that a full disk left by a copy cut
    /// short gets its space back first.
    public static func clearStaging(in directory: URL) {
        let staging = directory.appendingPathComponent(".staging")
        for f in (try? FileManager.default.contentsOfDirectory(atPath: staging.path)) ?? [] {
            unlink(staging.appendingPathComponent(f).path)
        }
    }

    public func path(_ ino: UInt64) -> String { prefix + String(ino) }

    private func pooled(_ n: UInt64) -> String { poolPrefix + String(n) }

    /// Opens the cache file of `ino`; returns the fd or -1 with errno set.
    public func open(_ ino: UInt64, writable: Bool) -> Int32 {
        Glibc.open(path(ino), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC)
    }

    public func createEmpty(_ ino: UInt64) throws {
        close(try createAndOpen(ino))
    }

    /// Creates an empty cache file for `ino` and returns it open for reading and writing.
    /// A file from the pool is taken first: a rename, where a new file costs the disk an
    /// inode (on ext4 without a journal, a search past every inode freed in the last 30 s).
    public func createAndOpen(_ ino: UInt64) throws -> Int32 {
        if let n = spare.withLock({ $0.names.popLast() }) {
            if rename(pooled(n), path(ino)) == 0 {
                let fd = Glibc.open(path(ino), O_RDWR | O_TRUNC | O_CLOEXEC)
                if fd >= 0 { return fd }
            } else {
                unlink(pooled(n))
            }
        }
        let fd = Glibc.open(path(ino), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        if fd < 0 { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        return fd
    }

    /// Drops the cache file of a deleted inode, keeping the file itself, emptied, for a new
    /// one (`createAndOpen`), unless the pool is full or a download still holds it open: a
    /// file goes to the pool only when nothing in the daemon can write to it any more. The
    /// caller makes sure no file handle has it open.
    public func recycle(_ ino: UInt64) {
        spare.withLock { s in
            if s.names.count < poolLimit, s.held[ino] == nil, Glibc.truncate(path(ino), 0) == 0,
               rename(path(ino), pooled(s.next)) == 0 {
                s.names.append(s.next)
                s.next += 1
            } else {
                unlink(path(ino))
            }
        }
    }

    /// Recycles the cache files of inodes not in `keeping` (at start, before any file is
    /// made: a crash can leave the cache file of a new file that no transaction recorded).
    /// Returns how many there were.
    public func sweep(keeping: Set<UInt64>) -> Int {
        var swept = 0
        for f in (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? [] {
            guard let ino = UInt64(f), String(ino) == f, !keeping.contains(ino) else { continue }
            recycle(ino)
            swept += 1
        }
        return swept
    }

    /// How many empty files wait in the pool.
    public var pooled: Int { spare.withLock { $0.names.count } }

    /// Opens the cache file of `ino` for a download (`flags` as open(2), mode 0600), held
    /// until `closeHeld`: a held file is never recycled. -1 with errno set on failure.
    public func openHeld(_ ino: UInt64, flags: Int32) -> Int32 {
        let (fd, e) = spare.withLock { s in
            let fd = Glibc.open(path(ino), flags | O_CLOEXEC, 0o600)
            if fd >= 0 { s.held[ino, default: 0] += 1 }
            return (fd, errno)
        }
        if fd < 0 { errno = e }
        return fd
    }

    public func closeHeld(_ ino: UInt64, _ fd: Int32) {
        close(fd)
        spare.withLock { s in
            if let c = s.held[ino] { s.held[ino] = c > 1 ? c - 1 : nil }
        }
    }

    /// Size of the cache file, or nil if there is none.
    public func size(of ino: UInt64) -> Int64? {
        var st = stat()
        return stat(path(ino), &st) == 0 ? Int64(st.st_size) : nil
    }

    public func truncate(_ ino: UInt64, to size: Int64) -> Int32 {
        Glibc.truncate(path(ino), off_t(size))
    }

    public func remove(_ ino: UInt64) { unlink(path(ino)) }

    /// Installs a fully downloaded file as the content of `ino` (atomic rename).
    public func install(_ tmp: String, as ino: UInt64) throws {
        if rename(tmp, path(ino)) != 0 { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    }

    /// Makes every cache file durable against power loss (at unmount): one syncfs(2) of
    /// the file system the cache is on.
    public func syncAll() {
        let fd = Glibc.open(directory.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd < 0 { return }
        _ = cubiq_syncfs(fd)
        close(fd)
    }

    /// Makes the cache file of `ino` durable against power loss (close(2) does not).
    public func sync(_ ino: UInt64) throws {
        let fd = Glibc.open(path(ino), O_RDONLY | O_CLOEXEC)
        if fd < 0 { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        defer { close(fd) }
        if fdatasync(fd) != 0 { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    }

    /// Copies the content of `ino` to a staging file for upload; returns its path. No room for
    /// the copy (the disk, or the state database's reserve) is `LocalWriteError(ENOSPC)`; a copy
    /// that fails leaves nothing behind.
    public func stage(_ ino: UInt64, generation: Int64) throws -> URL {
        let dst = staging.appendingPathComponent("\(ino)-\(generation)")
        let inp = Glibc.open(path(ino), O_RDONLY | O_CLOEXEC)
        if inp < 0 { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        defer { close(inp) }
        var st = stat()
        if fstat(inp, &st) == 0, let reserve, !reserve.contentHasRoom(for: Int64(st.st_size)) {
            throw LocalWriteError(errno: ENOSPC)
        }
        let out = Glibc.open(dst.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        if out < 0 {
            let e = errno
            if e == ENOSPC || e == EDQUOT { throw LocalWriteError(errno: e) }
            throw POSIXError(POSIXErrorCode(rawValue: e) ?? .EIO)
        }
        defer { close(out) }
        do {
            _ = try FileCopy.copy(from: inp, to: out)
        } catch {
            unlink(dst.path)
            throw error
        }
        return dst
    }
}

