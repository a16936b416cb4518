import CFuse
import CUbiqFuse
import Foundation
import Synchronization
import UbiqFS

/// The checks of a user's own mount (`PermissionChecks.daemon`): without `default_permissions`
/// the kernel checks no mode or owner (but exec of a file with no x bit at all), so each request
/// that a local disk checks against its caller is checked here, by `PermissionRules`, before
/// the core is called. Elsewhere these do nothing. What the kernel then does not ask for:
/// - search permission on a folder as a path is walked: it is asked only at `LOOKUP`, so a
///   name the kernel holds is walked through unchecked. A folder whose mode or owner changes
///   has the kernel forget its names (`folderAccessChanged`); a folder where the answer depends
///   on the caller's supplementary groups gives its names no entry timeout (`entryTimeout`);
///   a folder the caller may not search lists its names without attributes (readdirplus);
/// - the sticky bit: FUSE clears it from the kernel's copy of a folder's mode without the
///   option (`fuse_change_attributes_common`), so the removal check is made here;
/// - the read-and-write half of `fs.protected_hardlinks` (`permitLinking`).
extension FuseServer {
    /// Whether the caller of `req` may `want` (`PermissionRules.read`, …) of `ino`: EACCES if
    /// not. The item's attributes when it was checked (nil: the kernel checks, or nobody).
    @discardableResult
    func permit(_ req: fuse_req_t?, _ ino: UInt64, _ want: UInt32) throws -> Attributes? {
        guard checks == .daemon else { return nil }
        let a = try fs.getattr(ino)
        try PermissionRules.require(want, PermissionRules.Item(a), credentials(req))
        return a
    }

    /// Whether the caller may remove `name` from `parent` (unlink, rmdir; rename's source and
    /// the target it replaces), in ext4's order: search the folder (EACCES), find the name
    /// (ENOENT), then write to it and the sticky rule (EACCES, EPERM). The item removed.
    @discardableResult
    func permitRemoval(_ req: fuse_req_t?, _ parent: UInt64, _ name: [UInt8]) throws -> Attributes? {
        guard let folder = try permit(req, parent, PermissionRules.exec) else { return nil }
        let victim = try fs.attributes(of: name, in: parent)
        try PermissionRules.removal(of: PermissionRules.Item(victim), from: PermissionRules.Item(folder), credentials(req))
        return victim
    }

    /// Whether the caller may make `name` in `parent` (mkdir, mknod, symlink, link, create), in
    /// ext4's order: search the folder (EACCES), a name already there (EEXIST), then write to
    /// the folder (EACCES). The folder's attributes when it was checked.
    @discardableResult
    func permitNewName(_ req: fuse_req_t?, _ parent: UInt64, _ name: [UInt8]) throws -> Attributes? {
        guard let folder = try permit(req, parent, PermissionRules.exec) else { return nil }
        if (try? fs.attributes(of: name, in: parent)) != nil { throw FSError.exists }
        try PermissionRules.require(PermissionRules.write, PermissionRules.Item(folder), credentials(req))
        return folder
    }

    /// Whether the caller may open `name` in `parent` with `O_CREAT` (`flags`): a new name as
    /// `permitNewName`, or the file already there opened as `flags` ask (`O_EXCL`: EEXIST).
    /// The folder's attributes when it was checked.
    func permitCreate(_ req: fuse_req_t?, _ parent: UInt64, _ name: [UInt8], flags: Int32) throws -> Attributes? {
        guard let folder = try permit(req, parent, PermissionRules.exec) else { return nil }
        if let there = try? fs.attributes(of: name, in: parent) {
            if flags & O_EXCL != 0 { throw FSError.exists }
            try PermissionRules.require(PermissionRules.forOpen(flags: flags), PermissionRules.Item(there), credentials(req))
        } else {
            try PermissionRules.require(PermissionRules.write, PermissionRules.Item(folder), credentials(req))
        }
        return folder
    }

    /// Whether the caller may make a hard link to `ino` where `fs.protected_hardlinks` is on:
    /// the kernel's `may_linkat`, whose check of read and write permission on the file passes
    /// unchecked without `default_permissions`. The file's owner may; another caller only to a
    /// regular file that is neither setuid nor setgid-executable and that it may read and
    /// write (EPERM).
    func permitLinking(_ req: fuse_req_t?, _ ino: UInt64) throws {
        guard checks == .daemon, Self.protectedHardlinks else { return }
        let a = try fs.getattr(ino)
        let who = credentials(req)
        if who.uid == 0 || who.uid == a.uid { return }
        let safe = a.mode & 0o170000 == 0o100000 && a.mode & 0o4000 == 0 && a.mode & 0o2010 != 0o2010
            && PermissionRules.allows(PermissionRules.read | PermissionRules.write, PermissionRules.Item(a), who)
        if !safe { throw FSError.notPermitted }
    }

    /// `fs.protected_hardlinks`, read once (on unless it says 0).
    static let protectedHardlinks: Bool = {
        let v = try? String(contentsOfFile: "/proc/sys/fs/protected_hardlinks", encoding: .utf8)
        return v?.trimmingCharacters(in: .whitespacesAndNewlines) != "0"
    }()

    /// Whether the caller may rename `name` in `parent` to `newName` in `newParent`: remove
    /// the source; remove the target it replaces, or make a new name; and, for a folder that
    /// changes parents, write to it (its `..` changes). Exchanged (`RENAME_EXCHANGE`): the
    /// same the other way.
    func permitRename(_ req: fuse_req_t?, _ parent: UInt64, _ name: [UInt8], _ newParent: UInt64,
                      _ newName: [UInt8], flags: RenameFlags) throws {
        guard checks == .daemon else { return }
        let source = try permitRemoval(req, parent, name)
        let target: Attributes?
        if (try? fs.attributes(of: newName, in: newParent)) != nil {
            if flags.contains(.noReplace) { throw FSError.exists }
            target = try permitRemoval(req, newParent, newName)
        } else {
            try permitNewName(req, newParent, newName)
            target = nil
        }
        guard parent != newParent else { return }
        let who = credentials(req)
        for moved in [source, flags.contains(.exchange) ? target : nil] {
            if let moved, moved.mode & 0o170000 == 0o040000 {
                try PermissionRules.require(PermissionRules.write, PermissionRules.Item(moved), who)
            }
        }
    }

    /// `ch` as the caller of `req` may make it to `ino` (`PermissionRules.setattr`).
    func permitted(_ req: fuse_req_t?, _ ch: AttributeChanges, of ino: UInt64, throughHandle: Bool) throws -> AttributeChanges {
        guard checks == .daemon else { return ch }
        let a = try fs.getattr(ino)
        return try PermissionRules.setattr(ch, of: PermissionRules.Item(a), throughHandle: throughHandle, credentials(req))
    }

    /// Whether the caller of `req` may search `folder` (nil: the kernel checks, or nobody).
    func maySearch(_ req: fuse_req_t?, _ folder: Attributes?) -> Bool {
        guard let folder else { return true }
        return PermissionRules.allows(PermissionRules.exec, PermissionRules.Item(folder), credentials(req))
    }

    /// How long the kernel may keep a name in `folder` (checked by `permit`; nil: not checked
    /// here): none where the caller's right to search the folder depends on its supplementary
    /// groups, which differ between one process of the user and the next, but the kernel
    /// would walk the name for all of them.
    func entryTimeout(in folder: Attributes?, _ req: fuse_req_t?) -> Double {
        guard let folder else { return options.entryTimeout }
        let c = caller(req)
        let byGroup = folder.mode >> 3 & 1 != folder.mode & 1
        return folder.uid != c.uid && folder.gid != c.gid && byGroup ? 0 : options.entryTimeout
    }

    /// A folder's mode or owner changed: on a mount where ubiq checks, the kernel forgets the
    /// names it holds, so the next walk through one is a `LOOKUP` that checks search
    /// permission again. Linux 6.16 and later: every name on the mount, at once, before the
    /// change is answered (`FUSE_NOTIFY_INC_EPOCH`; a chmod of a folder is rare, and each name
    /// costs one lookup after it). Older kernels: the folder's held names one by one, after
    /// the answer (the kernel holds the folder's lock until then), so a walk in the moment
    /// between may pass.
    public func folderAccessChanged(_ ino: UInt64) {
        guard checks == .daemon, let se = session else { return }
        if !Self.epochUnknown.load(ordering: .relaxed) {
            let r = cubiqfuse_notify_inc_epoch(se)
            if r == 0 { return }
            Self.epochUnknown.store(true, ordering: .relaxed)
            logger.info("the kernel does not take FUSE_NOTIFY_INC_EPOCH (\(-r)): a folder's held names are dropped one by one after a chmod")
        }
        let names = fs.heldNames(in: ino)
        guard !names.isEmpty else { return }
        // A thread of their own: each waits for the folder's lock, and Dispatch's shared
        // threads run the store's work (`KernelNotices` in UbiqFS).
        Thread.detachNewThread { [self] in
            for n in names { invalidateEntry(ino, n) }
        }
    }

    private static let epochUnknown = Atomic(false)
}

/// The caller of `req`. Its supplementary groups are read (libfuse, from `/proc`) only when a
/// check depends on them; use it before `req` is answered.
func credentials(_ req: fuse_req_t?) -> Credentials {
    let c = caller(req)
    let pending = Unanswered(req: req)
    return Credentials(uid: c.uid, gid: c.gid) { g in supplementaryGroups(pending.req).contains(g) }
}

/// The supplementary groups of the caller of `req` (empty if they cannot be read).
func supplementaryGroups(_ req: fuse_req_t?) -> [gid_t] {
    var size = 64
    while true {
        var groups = [gid_t](repeating: 0, count: size)
        let n = Int(fuse_req_getgroups(req, Int32(size), &groups))
        if n < 0 { return [] }
        if n <= size { return Array(groups.prefix(n)) }
        size = n
    }
}
