import Foundation

/// Errors of the filesystem core, in POSIX terms. The FUSE binding maps
/// each to one errno (`FSError.errno`), in one place.
public enum FSError: Error, Equatable, CustomStringConvertible {
    case notFound           // ENOENT
    case exists             // EEXIST
    case notEmpty           // ENOTEMPTY
    case notDirectory       // ENOTDIR
    case isDirectory        // EISDIR
    case nameTooLong        // ENAMETOOLONG
    case invalid            // EINVAL
    case notPermitted       // EPERM
    case accessDenied       // EACCES
    case noAttribute        // ENODATA
    case notSupported       // EOPNOTSUPP
    case range              // ERANGE
    case busy               // EBUSY
    case noSpace            // ENOSPC
    case tooManyLinks       // EMLINK
    case badHandle          // EBADF
    case fileTooLarge       // EFBIG
    case timedOut           // a coordinated claim could not be had in time (EBUSY)
    case notUploaded        // EINPROGRESS: refused until the item's changes are in the store
    case stale              // ESTALE: what the kernel holds went; it looks the name up again
    case io(String)         // EIO: the store or the disk failed; the reason goes to the log
    case system(Int32)      // an errno from a local system call, passed through

    public var description: String {
        switch self {
        case .notFound: return "no such file or directory"
        case .exists: return "file exists"
        case .notEmpty: return "directory not empty"
        case .notDirectory: return "not a directory"
        case .isDirectory: return "is a directory"
        case .nameTooLong: return "name too long"
        case .invalid: return "invalid argument"
        case .notPermitted: return "operation not permitted"
        case .accessDenied: return "permission denied"
        case .noAttribute: return "no such attribute"
        case .notSupported: return "operation not supported"
        case .range: return "result out of range"
        case .busy: return "busy"
        case .noSpace: return "no space left on device"
        case .tooManyLinks: return "too many links"
        case .badHandle: return "bad file handle"
        case .fileTooLarge: return "file too large"
        case .timedOut: return "timed out waiting for sync work on the item"
        case .notUploaded: return "changes not yet in the store"
        case .stale: return "stale file handle"
        case .io(let why): return "I/O error: \(why)"
        case .system(let e): return String(cString: strerror(e))
        }
    }

    /// Classifies an errno from a local system call on the cache.
    static func fromErrno(_ e: Int32) -> FSError {
        switch e {
        case ENOSPC, EDQUOT: return .noSpace
        case ENOENT: return .notFound
        default: return .system(e)
        }
    }
}

/// Who is asking: the caller's credentials from the kernel request.
public struct Caller: Sendable {
    public var uid: UInt32
    public var gid: UInt32
    public var pid: Int32
    public init(uid: UInt32, gid: UInt32, pid: Int32 = 0) { self.uid = uid; self.gid = gid; self.pid = pid }
    public static let root = Caller(uid: 0, gid: 0)
}

/// A point in time, nanoseconds since the epoch.
public typealias Nanos = Int64

/// What `stat` shows.
public struct Attributes: Sendable, Equatable {
    public var ino: UInt64
    /// Full `st_mode`: type bits and permission bits.
    public var mode: UInt32
    public var nlink: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var rdev: UInt64
    public var size: Int64
    /// 512-byte blocks really held locally (0 for a placeholder).
    public var blocks: Int64
    public var atime: Nanos
    public var mtime: Nanos
    public var ctime: Nanos

    public var type: UInt32 { mode & UInt32(S_IFMT) }
    public var isDirectory: Bool { type == UInt32(S_IFDIR) }
}

public enum TimeChange: Sendable, Equatable {
    case now
    case at(Nanos)
}

/// The changes of one `setattr` call; nil fields stay as they are.
public struct AttributeChanges: Sendable {
    public var mode: UInt32?
    public var uid: UInt32?
    public var gid: UInt32?
    public var size: Int64?
    public var atime: TimeChange?
    public var mtime: TimeChange?
    /// Clear setuid and setgid (the kernel asks it of a chown, and of a truncation by a caller
    /// without CAP_FSETID, when the file system handles it: FUSE_HANDLE_KILLPRIV_V2). A `mode`
    /// is never given with it.
    public var clearSetID: SetIDClearing?
    public init(mode: UInt32? = nil, uid: UInt32? = nil, gid: UInt32? = nil, size: Int64? = nil,
                atime: TimeChange? = nil, mtime: TimeChange? = nil, clearSetID: SetIDClearing? = nil) {
        self.mode = mode; self.uid = uid; self.gid = gid; self.size = size
        self.atime = atime; self.mtime = mtime; self.clearSetID = clearSetID
    }
}

/// A change that must clear setuid/setgid (FUSE_HANDLE_KILLPRIV_V2): whether its caller is in
/// a group or may act as if (CAP_FSETID), asked only of a setgid file its group may not
/// execute (`Node.clearSetID`).
public struct SetIDClearing: Sendable {
    public let inGroup: @Sendable (UInt32) -> Bool
    public init(inGroup: @escaping @Sendable (UInt32) -> Bool) { self.inGroup = inGroup }
}

/// One entry of a directory listing.
public struct DirEntry: Sendable, Equatable {
    public var name: [UInt8]
    public var ino: UInt64
    /// `st_mode` type bits.
    public var type: UInt32
    /// Offset of the entry after this one (what readdir passes back).
    public var nextOffset: Int64
}

public struct FSStats: Sendable {
    public var blockSize: UInt64
    public var blocks: UInt64
    public var blocksFree: UInt64
    public var blocksAvailable: UInt64
    public var files: UInt64
    public var filesFree: UInt64
    public var nameMax: UInt64
}

/// rename(2) flags.
public struct RenameFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let noReplace = RenameFlags(rawValue: 1)
    public static let exchange = RenameFlags(rawValue: 2)
    public static let whiteout = RenameFlags(rawValue: 4)
}

public enum XattrSetMode: Sendable { case any, create, replace }

public let maxNameBytes = 255
public let rootIno: UInt64 = 1

/// What an open is answered, by what the kernel may believe of the file's size
/// (`FileSystem.kernelSizeAtOpen`).
public enum KernelSizeAtOpen: Sendable, Equatable {
    /// As usual.
    case known
    /// ESTALE: the kernel looks the name up again, and learns the size, before it opens.
    case lookAgain
    /// Opened with the kernel's page cache off for the handle (FOPEN_DIRECT_IO).
    case unsure
    /// ENOENT: the kernel's retry met a file that went too.
    case gone
}
