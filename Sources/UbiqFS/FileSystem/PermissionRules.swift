import Foundation

/// Who asks, for a check the daemon makes itself: the request's file-system uid and gid, and
/// whether the caller is in a group. The supplementary groups come from `/proc` (libfuse's
/// `fuse_req_getgroups`), so `supplementary` is asked only when a check depends on them.
public struct Credentials: Sendable {
    public let uid: UInt32
    public let gid: UInt32
    private let supplementary: @Sendable (UInt32) -> Bool

    public init(uid: UInt32, gid: UInt32, supplementary: @escaping @Sendable (UInt32) -> Bool = { _ in false }) {
        self.uid = uid; self.gid = gid; self.supplementary = supplementary
    }

    public func inGroup(_ g: UInt32) -> Bool { g == gid || supplementary(g) }
}

/// The checks ext4 makes of a caller, as the kernel's `generic_permission`, `may_delete`,
/// `setattr_prepare`, `may_setattr` and `xattr_permission` make them (no ACLs: ubiq keeps
/// none), for a caller without capabilities; uid 0 is taken as root with all of them. Pure
/// functions of an item's type, mode and owner and of the caller. A user's own mount, which
/// leaves `default_permissions` out, makes them as each request comes (UbiqFuse's
/// `CallerChecks`, with what the kernel then no longer does: search permission on held names,
/// the sticky bit, protected hard links); `access` makes them on every mount that asks. The
/// kernel still checks, with or without the option: exec of a file with no x bit at all,
/// `trusted.*` and `security.*` xattrs.
public enum PermissionRules {
    public static let read: UInt32 = 4, write: UInt32 = 2, exec: UInt32 = 1

    /// The owner and mode a check looks at.
    public struct Item: Sendable, Equatable {
        /// `st_mode`: type and permission bits.
        public var mode: UInt32
        public var uid: UInt32
        public var gid: UInt32
        public init(mode: UInt32, uid: UInt32, gid: UInt32) { self.mode = mode; self.uid = uid; self.gid = gid }
        public init(_ a: Attributes) { self.init(mode: a.mode, uid: a.uid, gid: a.gid) }
        var isDirectory: Bool { mode & UInt32(S_IFMT) == UInt32(S_IFDIR) }
    }

    /// Whether `who` may `want` (`read`, `write`, `exec`, or'ed) of `item`: the owner's bits for
    /// its owner, else the group's for a member of its group, else the others'. Root may do all
    /// but run a file with no x bit.
    public static func allows(_ want: UInt32, _ item: Item, _ who: Credentials) -> Bool {
        if who.uid == 0 {
            return want & exec == 0 || item.isDirectory || item.mode & 0o111 != 0
        }
        let bits: UInt32
        if who.uid == item.uid {
            bits = (item.mode >> 6) & 7
        } else {
            let group = (item.mode >> 3) & 7, others = item.mode & 7
            // The groups are asked only where the answer depends on them.
            bits = group != others && who.inGroup(item.gid) ? group : others
        }
        return want & ~bits == 0
    }

    /// Whether `who` may remove (or rename away) `victim` from `folder`: write and search on
    /// the folder (EACCES), and in a sticky folder only the owner of the item or of the folder
    /// (EPERM).
    public static func removal(of victim: Item, from folder: Item, _ who: Credentials) throws {
        try require(write | exec, folder, who)
        if who.uid != 0, folder.mode & UInt32(S_ISVTX) != 0, who.uid != victim.uid, who.uid != folder.uid {
            throw FSError.notPermitted
        }
    }

    /// `allows`, or EACCES.
    public static func require(_ want: UInt32, _ item: Item, _ who: Credentials) throws {
        if !allows(want, item, who) { throw FSError.accessDenied }
    }

    /// What an `open(2)` with `flags` needs of the file: read and write by its access mode, write
    /// for `O_TRUNC`, exec for `execve` (the kernel marks its open with `__FMODE_EXEC`).
    public static func forOpen(flags: Int32) -> UInt32 {
        var want: UInt32
        switch flags & O_ACCMODE {
        case O_WRONLY: want = write
        case O_RDWR: want = read | write
        default: want = read
        }
        if flags & O_TRUNC != 0 { want |= write }
        if flags & fmodeExec != 0 { want |= exec }
        return want
    }

    /// The kernel's `__FMODE_EXEC` open flag (include/linux/fcntl.h): the open of `execve`.
    public static let fmodeExec: Int32 = 0o40

    /// Whether `who` may make `ch` to `item`, and the change as ext4 would make it (a mode's
    /// setgid bit dropped for a caller not in the file's group), or the error ext4 gives:
    /// - owner and group: only root changes the owner (EPERM; the owner may name itself);
    ///   the owner may change the group to one of its own;
    /// - mode: the owner (EPERM);
    /// - times: the owner (EPERM); both "now" (`utimes(NULL)`): the owner, or with write
    ///   permission (EACCES);
    /// - size: write permission (EACCES), unless it comes through an open file (`throughHandle`:
    ///   `ftruncate`, or `open` with `O_TRUNC`, which the open's check covered).
    /// Times through an open file are the kernel's own (its write-back cache setting a writer's
    /// mtime at flush), never a caller's `futimens`, which comes without the handle: allowed.
    public static func setattr(_ ch: AttributeChanges, of item: Item, throughHandle: Bool,
                               _ who: Credentials) throws -> AttributeChanges {
        if who.uid == 0 { return ch }
        let owner = who.uid == item.uid
        var ch = ch
        if let u = ch.uid, !(owner && u == item.uid) { throw FSError.notPermitted }
        if let g = ch.gid, !(owner && (g == item.gid || who.inGroup(g))) { throw FSError.notPermitted }
        if let m = ch.mode {
            guard owner else { throw FSError.notPermitted }
            if m & UInt32(S_ISGID) != 0 && !who.inGroup(ch.gid ?? item.gid) { ch.mode = m & ~UInt32(S_ISGID) }
        }
        // "Now" for both times is `utimes(NULL)`; anything else (a time given, or one left
        // out) is a setting of times, the owner's alone.
        if (ch.atime != nil || ch.mtime != nil) && !throughHandle && !owner {
            guard ch.atime == .now && ch.mtime == .now else { throw FSError.notPermitted }
            try require(write, item, who)
        }
        if ch.size != nil && !throughHandle { try require(write, item, who) }
        return ch
    }

    /// What reading (`write` false) or writing an xattr called `name` needs: for `user.*`, read
    /// or write permission on the item (`xattr_permission`); nothing of the file system for the
    /// others, which the kernel checks itself whoever checks modes (`trusted.*` is root's,
    /// `security.*` the security module's, and read by anyone).
    public static func forXattr(_ name: [UInt8], write writing: Bool) -> UInt32 {
        guard name.starts(with: Array("user.".utf8)) else { return 0 }
        return writing ? write : read
    }
}
