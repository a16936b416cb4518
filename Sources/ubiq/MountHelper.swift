import Foundation

/// The calling convention of mount(8) for FUSE types (`mount -t fuse.ubiq SOURCE DIR`, or an
/// `/etc/fstab` line with type `fuse.ubiq`): mount.fuse3 runs `ubiq SOURCE DIR -o OPTIONS`.
/// ubiq's own options go in OPTIONS with `_` or `-` (`state=DIR,cache_size=20G`); the rest
/// are FUSE mount options.
enum MountHelper {
    static let valued = ["state", "cache-size", "bwlimit", "quota", "poll-interval", "full-listing-interval", "upload-delay", "read-timeout", "transfers",
                         "drain-timeout", "no-download-for", "s3-endpoint", "s3-region", "container", "scope"]
    static let flags = ["writeback-cache", "download-for-all", "create-store", "sync-on-close"]
    /// Options mount(8) or fstab may pass that mean nothing to a FUSE mount.
    /// And "dev" and "suid", which mount.fuse3 adds to every mount made as root, asked for or
    /// not: left out, an fstab mount is nosuid,nodev like one made by `ubiq mount`.
    static let ignored: Set<String> = ["defaults", "auto", "noauto", "user", "users", "nouser", "nofail", "_netdev", "rw",
                                       "dev", "suid"]

    static func rewrite(_ args: [String]) -> [String]? {
        guard args.count >= 2, !args[0].hasPrefix("-"), args[1].hasPrefix("/"),
              !Ubiq.configuration.subcommands.contains(where: { $0._commandName == args[0] }) else { return nil }
        // Silent once mounted, as mount(8)'s helpers are.
        var out = ["mount", "--quiet", "--store", args[0]]
        // `mount -o remount,...`: the mount's options change in place (`Remount`).
        if let i = args.firstIndex(of: "-o"), i + 1 < args.count, args[i + 1].split(separator: ",").contains("remount") {
            return ["mount", "--quiet", "--remount", "-o", args[i + 1], args[1]]
        }
        var fuse: [String] = []
        var i = 2
        while i < args.count {
            let a = args[i]
            if a == "-o", i + 1 < args.count {
                for opt in args[i + 1].split(separator: ",").map(String.init) {
                    let parts = opt.split(separator: "=", maxSplits: 1).map(String.init)
                    let key = parts[0].replacingOccurrences(of: "_", with: "-")
                    if valued.contains(key), parts.count == 2 {
                        // fstab separates list items with ':' (a ',' would end the option).
                        out += ["--" + key, key == "no-download-for" ? parts[1].replacingOccurrences(of: ":", with: ",") : parts[1]]
                    } else if flags.contains(key) {
                        out.append("--" + key)
                    } else if ignored.contains(opt) || opt.hasPrefix("x-") || opt.hasPrefix("comment=") {
                        continue
                    } else {
                        fuse.append(opt)
                    }
                }
                i += 2
            } else {
                i += 1  // -n, -v, -s and the like from mount(8): nothing to do
            }
        }
        if !fuse.isEmpty { out += ["-o", fuse.joined(separator: ",")] }
        out.append(args[1])
        return out
    }
}
