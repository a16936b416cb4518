import Foundation

/// `mount -o remount,ro DIR` (mount(8) runs ubiq so, through mount.fuse3, with the mount's
/// present options and the new ones) and `ubiq mount --remount -o ro DIR`: a mounted ubiq
/// goes read-only or read-write, or takes or drops `noexec`, in place, as the kernel's own file
/// systems do; the daemon and what it holds stay. Anything else cannot change on a live
/// mount, and is refused with what to do instead.
enum Remount {
    // mount(2)'s flags and statvfs(3)'s (<sys/mount.h>, <sys/statvfs.h>).
    static let rdonly: UInt = 1, nosuid: UInt = 2, nodev: UInt = 4, noexec: UInt = 8, remount: UInt = 32
    static let noatime: UInt = 1024, nodiratime: UInt = 2048, relatime: UInt = 1 << 21, strictatime: UInt = 1 << 24
    static let stRelatime: UInt = 4096

    /// Options a remount takes as they are: what mount.fuse3 adds for root (`dev`, `suid`: ubiq
    /// mounts are nosuid,nodev by design), what fstab and mtab carry (the FUSE mount's own
    /// `user_id=`, `group_id=`, ubiq's `state=` and the like) and mount(8)'s own.
    static let unchanged: Set<String> = ["remount", "defaults", "auto", "noauto", "user", "users", "nouser", "nofail",
                                         "_netdev", "dev", "suid", "nodev", "nosuid", "nodiratime", "diratime"]

    /// Applies `options` to the ubiq mount at `mountpoint`; what it did, for the terminal.
    static func apply(_ mountpoint: String, options: [String]) throws -> String {
        let mp = Paths.absolute(mountpoint)
        guard let entry = Mounts.entry(at: mp) else { throw UserError("\(mp) is not mounted: nothing to remount") }
        guard entry.type == "fuse.ubiq" else { throw UserError("\(mp) is not a ubiq mount (\(entry.type))") }
        var st = statvfs()
        guard statvfs(mp, &st) == 0 else { throw UserError("\(mp): \(String(cString: strerror(errno)))") }
        // The mount's present flags: a remount sets all of them, so those not named stay.
        var flags = st.f_flag & (rdonly | nosuid | nodev | noexec | noatime | nodiratime)
        flags |= st.f_flag & stRelatime != 0 ? relatime : (st.f_flag & noatime != 0 ? 0 : strictatime)
        flags |= nosuid | nodev
        for o in options.flatMap({ $0.split(separator: ",").map(String.init) }) {
            let key = o.split(separator: "=", maxSplits: 1).first.map(String.init) ?? o
            switch o {
            case "ro": flags |= rdonly
            case "rw": flags &= ~rdonly
            case "noexec": flags |= noexec
            case "exec": flags &= ~noexec
            case "noatime" where flags & noatime == 0, "relatime" where flags & noatime != 0,
                 "strictatime" where flags & noatime != 0, "atime" where flags & noatime != 0:
                throw UserError("\(o) cannot change on a remount: ubiq unmount \(mp), then mount it again with -o \(o)")
            case "noatime", "relatime", "strictatime", "atime": continue
            case "allow_other", "allow_root", "default_permissions":
                if !entry.superOptions.contains(o) {
                    throw UserError("\(o) cannot change on a remount: ubiq unmount \(mp), then mount it again with -o \(o)")
                }
            default:
                let ubiqOption = MountHelper.valued.contains(key.replacingOccurrences(of: "_", with: "-"))
                    || MountHelper.flags.contains(key.replacingOccurrences(of: "_", with: "-"))
                if unchanged.contains(o) || ubiqOption || ["user_id", "group_id", "fsname", "subtype"].contains(key)
                    || o.hasPrefix("x-") || o.hasPrefix("comment=") { continue }
                throw UserError("\(o) cannot change on a remount (ro, rw, exec and noexec can): ubiq unmount \(mp), then mount it again")
            }
        }
        guard mount(nil, mp, nil, remount | flags, nil) == 0 else {
            let e = errno
            if e == EPERM { throw UserError("remounting \(mp) needs root; as its owner: ubiq unmount \(mp), then mount it again with -o ro") }
            throw UserError("cannot remount \(mp): \(String(cString: strerror(e)))")
        }
        let said = [flags & rdonly != 0 ? "read-only" : "read-write", flags & noexec != 0 ? "noexec" : nil].compactMap { $0 }
        return "Remounted \(mp): \(said.joined(separator: ", "))."
    }
}
