import Foundation

/// When a read of a file moves its access time: the mount's `relatime` (the default, as the
/// kernel's own file systems), `strictatime` or `noatime` (mount(8)'s options; the last one
/// given wins). The kernel leaves a FUSE file's access time to the file system, so ubiq keeps
/// these rules itself. Only a read of the file's bytes (`cat`, an exec) moves it; `touch -a`
/// and `utimensat` set it under every mode.
public enum AccessTimes: String, Sendable {
    /// When it is older than the last change, or a day old.
    case relative = "relatime"
    /// At every read.
    case strict = "strictatime"
    /// Never.
    case never = "noatime"

    /// The mode the mount options ask for, and the options left for libfuse: it knows
    /// `noatime` (which it passes to mount(2), so /proc/mounts says so) and not the others.
    public static func from(mountOptions: [String]) -> (AccessTimes, rest: [String]) {
        var mode = AccessTimes.relative
        var rest: [String] = []
        for o in mountOptions {
            switch o {
            case "noatime": mode = .never; rest.append(o)
            case "relatime", "atime": mode = .relative
            case "strictatime": mode = .strict
            default: rest.append(o)
            }
        }
        return (mode, rest)
    }

    /// Whether a read at `now` moves an access time of `atime`, for content changed at
    /// `mtime` and attributes at `ctime` (nanoseconds since 1970).
    func moves(atime: Int64, mtime: Int64, ctime: Int64, now: Int64) -> Bool {
        switch self {
        case .never: return false
        case .strict: return atime != now
        case .relative: return atime <= mtime || atime <= ctime || now - atime >= 86_400_000_000_000
        }
    }
}
