import Foundation
import Synchronization

/// Space held on the state disk for the state database, so that it can still commit when
/// the disk fills up: an `rm` that would free space, a `close`, an upload's record must not
/// fail for want of space.
///
/// The space is a file beside the database (`state.db.reserve`), allocated in full. A commit
/// that finds the disk full gives it up and tries again. From then until it is taken back,
/// file content (writes, downloads, staging copies) may not use the space it held:
/// `contentHasRoom(for:)` says no while fewer than `bytes` would stay free. So content can
/// fill the disk only up to the reserve, and what the reserve freed is the database's.
public final class DiskReserve: Sendable {
    /// The reserve's file (nil: an in-memory database, which needs none).
    public let path: String?
    /// The space it holds.
    public let bytes: Int64
    /// Taken back only when this much more than `bytes` is free, so that taking it does not
    /// fill the disk again at once.
    public let margin: Int64

    /// Free bytes on the disk holding a path (statvfs; tests give their own).
    private let freeBytes: @Sendable (String) -> Int64?

    /// Guards the reserve's file: a release never races a restore half-way (`held` mirrors it).
    private let held: Mutex<Bool>

    public init(path: String?, bytes: Int64 = 8 << 20, margin: Int64 = 4 << 20,
                freeBytes: @escaping @Sendable (String) -> Int64? = DiskReserve.freeBytes(at:)) {
        self.path = path
        self.bytes = bytes
        self.margin = margin
        self.freeBytes = freeBytes
        held = Mutex(path.map { access($0, F_OK) == 0 } ?? true)
    }

    /// Whether the reserve is in place.
    public var isHeld: Bool { held.withLock { $0 } }

    /// Gives the reserve up for the database; true if there was one.
    public func release() -> Bool {
        guard let path else { return false }
        return held.withLock { held in
            let was = unlink(path) == 0
            held = false
            return was
        }
    }

    /// Takes the reserve (back) if it is missing and the disk has room for it and the margin.
    @discardableResult
    public func restore() -> Bool {
        guard let path else { return true }
        return held.withLock { held in
            if held { return true }
            if access(path, F_OK) == 0 { held = true; return true }
            guard let free = freeBytes(path), free >= bytes + margin else { return false }
            let tmp = path + ".tmp"
            let fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            guard fd >= 0 else { return false }
            let ok = posix_fallocate(fd, 0, off_t(bytes)) == 0
            close(fd)
            if ok && rename(tmp, path) == 0 { held = true } else { unlink(tmp) }
            return held
        }
    }

    /// Whether `bytes` more of file content may be written on the state disk. While the
    /// reserve is held, yes (its file keeps the database's space); once it was given up, only
    /// while that much space would stay free beside the new content.
    public func contentHasRoom(for bytes: Int64) -> Bool {
        guard let path, !isHeld else { return true }
        guard let free = freeBytes(path) else { return true }
        return free - max(0, bytes) >= self.bytes
    }

    /// Free bytes for unprivileged use on the filesystem holding `path` (or its folder).
    public static func freeBytes(at path: String) -> Int64? {
        var st = statvfs()
        let dir = (path as NSString).deletingLastPathComponent
        guard statvfs(dir.isEmpty ? "." : dir, &st) == 0 else { return nil }
        return Int64(st.f_bavail) * Int64(st.f_frsize)
    }
}
