import ArgumentParser
import Foundation
import UbiqClock
import Logging
import UbiqCoordinator
import UbiqFS
import UbiqFuse
import UbiqS3
import UbiqState
import UbiqStore
import UbiqSync

struct Mount: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount a store at MOUNTPOINT (returns once the mount is ready).",
        discussion: prose("""
            Store URLs: dir:/path (or a plain path) for the embedded store; s3://BUCKET/PREFIX for a
            bucket of an S3-compatible service (AWS S3, Ceph RGW, SeaweedFS, MinIO, Garage), with
            credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws/credentials (AWS_PROFILE).
            Default store: ~/.local/share/ubiq/store. Default state: ~/.local/state/ubiq/<mount id>,
            one per mount point, so two mount points of one store are two devices.

            Examples:
              ubiq mount ~/Ubiquity
              ubiq mount --store dir:/srv/team-store --state /var/tmp/ubiq-state ~/Team
              ubiq mount --foreground -o allow_other /mnt/cloud
              ubiq mount --store s3://photos/family --s3-endpoint http://nas:8333 ~/Photos
            """))

    @Option(help: "Store URL: dir:PATH, PATH, or s3://BUCKET/PREFIX.", completion: .directory)
    var store: String?

    @Option(help: ArgumentHelp("S3 service address for an s3:// store (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS in the region).", valueName: "URL"))
    var s3Endpoint: String?

    @Option(help: ArgumentHelp("S3 region for signing (default: $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1).", valueName: "REGION"))
    var s3Region: String?

    @Option(help: ArgumentHelp("Mount this container of the store (ubiq container create) instead of the store's root.", valueName: "NAME"))
    var container: String?

    @Option(help: ArgumentHelp("With --container: documents (its Documents folder only) or all (Documents and its data).", valueName: "SCOPE"), completion: .list(["documents", "all"]))
    var scope: String = "all"

    @Option(help: "State directory (database, content cache, log).", completion: .directory)
    var state: String?

    @Flag(help: "Stay in the foreground (logs to the terminal too).")
    var foreground = false

    @Option(name: .customShort("o"), help: "Extra FUSE mount options, comma-separated (e.g. allow_other: let other users in).")
    var options: [String] = []

    @Option(help: "Seconds `ubiq unmount` waits for pending uploads by default.")
    var drainTimeout: Double = 30

    @Option(help: ArgumentHelp("Local content to keep at most, e.g. 20G, 500M (default: a quarter of the free space where the cache is, at least 1G); least recently used files beyond it become placeholders again.", valueName: "SIZE"))
    var cacheSize: String?

    @Option(help: ArgumentHelp("Limit transfers to and from the store, bytes a second: RATE both ways, or UP:DOWN (e.g. 2M, 512K:8M; 0 or off for no limit that way).", valueName: "RATE"))
    var bwlimit: String?

    @Option(help: ArgumentHelp("Set the embedded store's quota (kept in the store, like a provider's): uploads beyond it are refused and retried, and df shows it. 0 removes it.", valueName: "SIZE"))
    var quota: String?

    @Option(help: "Seconds an upload waits after the last change to a file (coalesces bursts of saves).")
    var uploadDelay: Double = 2

    @Option(help: "Uploads sent to the store at once, 1 to 64 (default 8 to S3, 4 to the embedded store; 1: one at a time, in order).")
    var transfers: Int?

    @Option(help: "Seconds a read of a file that is not here waits for the store before it fails with EIO.")
    var readTimeout: Double = 60

    @Option(help: "Seconds between looks at the store for other devices' changes (ubiq sync looks at once).")
    var pollInterval: Double = 3

    @Option(help: "S3: seconds between listings of the whole bucket, which find what other tools changed (other devices' changes come from the bucket's change log at every poll; ubiq sync --full lists at once).")
    var fullListingInterval: Double = 300

    @Option(help: ArgumentHelp("Programs that may not trigger downloads, comma-separated (default: common thumbnailers and indexers).",
                               valueName: "NAMES"))
    var noDownloadFor: String?

    @Flag(help: "Let every program trigger downloads (no thumbnailer/indexer policy).")
    var downloadForAll = false

    /// Accepted from older command lines, fstab and config files, and ignored with a warning
    /// (`Mount.run`): docs/kernel-options.md.
    @Flag(help: .hidden)
    var writebackCache = false

    @Flag(help: "Make close(2) sync what was written to disk, as fsync(2) does (slower). By default close is safe against a killed daemon, and fsync against power loss, as on ext4.")
    var syncOnClose = false

    @Flag(help: "Make a new embedded store where --store points if there is none (only the default store is made without it).")
    var createStore = false

    @Flag(help: .hidden)
    var notifyReady = false

    @Flag(help: "Change the options of the ubiq mount at MOUNTPOINT in place: ro, rw, exec, noexec (mount -o remount,ro does this; root only).")
    var remount = false

    @Flag(help: "Print nothing once mounted (errors still go to stderr); a mount by mount(8) or fstab is quiet, as its helpers are.")
    var quiet = false

    @Argument(help: "Where to mount (an existing, empty directory).", completion: .directory)
    var mountpoint: String

    func run() throws {
        if remount {
            do {
                let said = try Remount.apply(mountpoint, options: options)
                if !quiet { print(said) }
            } catch { fail("\(error)") }
            return
        }
        if writebackCache {
            FileHandle.standardError.write(Data("""
                ubiq: writeback-cache is ignored: with it the kernel keeps its own size of a file, and a \
                file another device changed would read cut short or run on (docs/kernel-options.md)

                """.utf8))
        }
        let plan: MountPlan
        do { plan = try MountPlan.check(self) } catch { fail("\(error)") }
        if foreground {
            Daemon(plan: plan, echo: isatty(2) != 0 && !notifyReady, notify: notifyReady).run()
        } else {
            spawnDaemon(plan)
        }
    }

    /// Starts `ubiq mount --foreground` detached and waits until it says it is ready.
    private func spawnDaemon(_ plan: MountPlan) {
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        let p = Process()
        p.executableURL = exe
        var args = ["mount", "--foreground", "--notify-ready", "--store", plan.storeURL, "--state", plan.stateDir,
                    "--drain-timeout", String(drainTimeout), "--upload-delay", String(uploadDelay),
                    "--poll-interval", String(pollInterval), "--full-listing-interval", String(fullListingInterval),
                    "--read-timeout", String(readTimeout), "--transfers", String(plan.transfers)]
        for o in options { args += ["-o", o] }
        if syncOnClose { args.append("--sync-on-close") }
        if let noDownloadFor { args += ["--no-download-for", noDownloadFor] }
        args += ["--cache-size", String(plan.cacheSize)]
        if let b = plan.bandwidth { args += ["--bwlimit", b.text] }
        if let q = plan.quota { args += ["--quota", String(q)] }
        if let c = plan.container { args += ["--container", c, "--scope", plan.scope] }
        args += plan.store.daemonArguments
        if downloadForAll { args.append("--download-for-all") }
        args.append(plan.mountpoint)
        p.arguments = args
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = FileHandle.nullDevice
        p.standardInput = FileHandle.nullDevice
        do { try p.run() } catch { fail("cannot start the daemon: \(error)") }
        var line = ""
        let h = pipe.fileHandleForReading
        while true {
            let d = h.availableData
            if d.isEmpty { break }
            line += String(decoding: d, as: UTF8.self)
            if line.contains("\n") { break }
        }
        let first = line.split(separator: "\n").first.map(String.init) ?? ""
        if first == "ready" {
            let what = plan.container.map { "container \($0)\(plan.scope == "documents" ? " (its Documents)" : "") of \(plan.storeURL)" } ?? plan.storeURL
            if !quiet { print("Mounted \(what) at \(plan.mountpoint). Unmount with: ubiq unmount \(plan.mountpoint)") }
            return
        }
        // Not mounted: what this mount made goes (nothing was acknowledged in it).
        p.waitUntilExit()
        for path in plan.made.reversed() { try? FileManager.default.removeItem(atPath: path) }
        if first.hasPrefix("error: ") { fail(String(first.dropFirst(7))) }
        let log = plan.made.contains(plan.stateDir) ? "" : "; see \(plan.stateDir)/ubiq.log"
        fail("the daemon exited before the mount was ready\(log)")
    }
}

/// Everything `mount` checked, resolved to absolute paths.
struct MountPlan {
    var mountpoint: String
    var store: any StoreBackend
    var storeURL: String { store.url }
    var container: String?
    /// "all" or "documents".
    var scope: String
    /// The mount's source as df and /proc/mounts show it.
    var fsname: String { "ubiq:" + (store.folder ?? storeURL) }
    var stateDir: String
    var fuseOptions: FuseOptions
    var drainTimeout: Double
    var uploadDelay: Double
    var pollInterval: Double
    var fullListingInterval: Double = 300
    var readTimeout: Double
    var transfers = 1
    var hydration: HydrationPolicy
    var cacheSize: Int64
    var syncOnClose = false
    /// When a read moves an access time (mount options `relatime`, `strictatime`, `noatime`).
    var accessTimes = AccessTimes.relative
    /// nil: leave the store's quota as it is; 0: remove it.
    var quota: Int64?
    /// `--bwlimit` (nil: none).
    var bandwidth: Bandwidth?
    /// What this mount made (a new store's directory, a new state directory): a mount that
    /// fails removes it again, so that a failed mount leaves nothing behind.
    var made: [String] = []

    static func check(_ m: Mount) throws -> MountPlan {
        let seconds = [secondsRefused(m.readTimeout, "--read-timeout"), secondsRefused(m.pollInterval, "--poll-interval"),
                       secondsRefused(m.fullListingInterval, "--full-listing-interval"),
                       secondsRefused(m.drainTimeout, "--drain-timeout", zero: true), secondsRefused(m.uploadDelay, "--upload-delay", zero: true)]
        if let refused = seconds.compactMap({ $0 }).first { throw UserError(refused) }
        if let t = m.transfers, !(1 ... 64).contains(t) { throw UserError("--transfers must be from 1 to 64, not \(t)") }
        let mp = Paths.absolute(m.mountpoint)
        var isDir: ObjCBool = false
        if let e = Mounts.entry(at: mp) {
            let alive = Mounts.record(for: mp).map(Mounts.isRunning) ?? false
            if e.type == "fuse.ubiq" && !alive {
                // A daemon that died (killed) left its mount behind: clear it.
                _ = Mounts.fusermount(["-u", "-z", mp])
                if Mounts.entry(at: mp) != nil { throw UserError("\(mp) has a dead ubiq mount that could not be cleared: run fusermount3 -u -z \(mp)") }
            } else {
                throw UserError("\(mp) is already a mount point (\(e.type))")
            }
        }
        guard FileManager.default.fileExists(atPath: mp, isDirectory: &isDir) else {
            throw UserError("mount point \(mp) does not exist")
        }
        guard isDir.boolValue else { throw UserError("mount point \(mp) is not a directory") }
        let allowNonEmpty = m.options.contains { $0.split(separator: ",").contains("nonempty") }
        if !allowNonEmpty, let items = try? FileManager.default.contentsOfDirectory(atPath: mp), !items.isEmpty {
            throw UserError("mount point \(mp) is not empty")
        }
        if access("/dev/fuse", R_OK | W_OK) != 0 {
            throw UserError("cannot use /dev/fuse (\(String(cString: strerror(errno)))): is the fuse module loaded?")
        }
        if getuid() != 0 && !Self.inPath("fusermount3") {
            throw UserError("fusermount3 is not installed (Debian: apt-get install fuse3)")
        }
        // The store.
        let url = m.store ?? "dir:" + Paths.defaultStore
        let store = try Self.parseStore(url, s3Endpoint: m.s3Endpoint, s3Region: m.s3Region)
        if let c = m.container {
            do { try Containers.validate(name: c) } catch { throw UserError("\(error)".replacingOccurrences(of: "store error: ", with: "")) }
        }
        guard ["all", "documents"].contains(m.scope) else { throw UserError("--scope is documents or all, not \(m.scope)") }
        if m.scope != "all" && m.container == nil { throw UserError("--scope applies to a container: add --container NAME") }
        let storePath = store.folder
        if let path = storePath {
            if path == mp || path.hasPrefix(mp + "/") { throw UserError("the store cannot be inside the mount point") }
            try Self.checkDirectory(path, what: "store")
        }
        // The state.
        let stateDir = m.state.map(Paths.absolute) ?? Paths.defaultState(for: mp)
        if stateDir == mp || stateDir.hasPrefix(mp + "/") { throw UserError("the state directory cannot be inside the mount point") }
        try Self.checkDirectory(stateDir, what: "state directory")
        if let holder = StateLock.waitForUnmounted(stateDir, seconds: 120) {
            throw UserError("state directory \(stateDir) is in use by another ubiq daemon (pid \(holder))")
        }
        if let why = StateCheck.unusableDatabase(in: stateDir) {
            throw UserError("state directory \(stateDir) holds cached files but \(why); nothing was changed: ubiq recover --state \(stateDir) --store URL DEST copies its edits out, then mount with a new --state")
        }
        var quota: Int64?
        if let text = m.quota {
            guard let v = Self.parseSize(text) else { throw UserError("invalid --quota \(text): use a size like 10G, or 0 for none") }
            quota = v
            if storePath == nil { throw UserError("--quota sets the embedded store's quota; an S3 bucket's limits are the service's") }
        }
        let bandwidth = try m.bwlimit.map { text in
            guard let b = Bandwidth.parse(text) else {
                throw UserError("invalid --bwlimit \(text): use a rate like 2M (both ways) or UP:DOWN like 512K:8M (0 or off: no limit)")
            }
            return b
        } ?? nil
        var cacheSize: Int64 = 0
        if let text = m.cacheSize {
            guard let v = Self.parseSize(text), v > 0 else { throw UserError("invalid --cache-size \(text): use a size like 500M or 20G") }
            cacheSize = v
        }
        // A store is made only where asked (--create-store) or as the default store, never at a
        // mistyped path, and never for a device that synced with a store that is now missing.
        let fm = FileManager.default
        if let storePath {
            if !fm.fileExists(atPath: storePath) {
                if fm.fileExists(atPath: stateDir + "/state.db") {
                    throw UserError("the store this device synced with is missing: nothing at \(storePath) (moved or deleted?); mount it where it is now with --store, or start another device with a new --state")
                }
                guard m.createStore || storePath == Paths.defaultStore else {
                    throw UserError("no store at \(storePath): to make a new one there, add --create-store")
                }
            } else if !DirectoryStore.isStore(at: storePath), let items = try? fm.contentsOfDirectory(atPath: storePath), !items.isEmpty {
                throw UserError("\(storePath) is not a ubiq store (it holds files but no store.db)")
            }
        }
        // Every check passed: only now create what is missing.
        var made: [String] = []
        if let storePath, !fm.fileExists(atPath: storePath) {
            try Self.createDirectory(storePath, what: "store", mode: 0o700)
            made.append(storePath)
        } else if let storePath, (try? fm.contentsOfDirectory(atPath: storePath))?.isEmpty == true {
            // An empty folder becomes a store: what makes it one goes if the mount fails.
            made += DirectoryStore.layout.map { storePath + "/" + $0 }
        }
        if !fm.fileExists(atPath: stateDir) { made.append(stateDir) }
        try Self.createDirectory(stateDir, what: "state directory", mode: 0o700)
        if cacheSize == 0 {
            var st = statvfs()
            let free = statvfs(stateDir, &st) == 0 ? Int64(st.f_bavail) * Int64(st.f_frsize) : 0
            cacheSize = max(1 << 30, free / 4)
        }
        var fo = FuseOptions()
        fo.operationStats = ProcessInfo.processInfo.environment["UBIQ_OP_STATS"] == "1"
        let (accessTimes, fuseMountOptions) = AccessTimes.from(
            mountOptions: m.options.flatMap { $0.split(separator: ",").map(String.init) }.filter { $0 != "nonempty" })
        fo.mountOptions = fuseMountOptions
        return MountPlan(mountpoint: mp, store: store, container: m.container, scope: m.scope, stateDir: stateDir,
                         fuseOptions: fo, drainTimeout: m.drainTimeout, uploadDelay: m.uploadDelay, pollInterval: m.pollInterval,
                         fullListingInterval: m.fullListingInterval, readTimeout: m.readTimeout, transfers: m.transfers ?? store.transfers,
                         hydration: m.downloadForAll ? .off
                             : HydrationPolicy(blocked: m.noDownloadFor.map { Set($0.split(separator: ",").map(String.init)) }
                                 ?? HydrationPolicy.defaultBlocked),
                         cacheSize: cacheSize, syncOnClose: m.syncOnClose, accessTimes: accessTimes, quota: quota,
                         bandwidth: bandwidth, made: made)
    }

    /// The kinds of store a device can mount, the one place they are chosen: the first that
    /// takes a URL is its backend (docs/architecture.md, "Add a store backend").
    static let storeBackends: [any StoreBackend.Type] = [S3Backend.self, DirectoryBackend.self]

    /// A store URL (`dir:PATH`, `PATH`, `s3://BUCKET/PREFIX`) and its S3 options, checked.
    static func parseStore(_ url: String, s3Endpoint: String?, s3Region: String?) throws -> any StoreBackend {
        let options = StoreURLOptions(s3Endpoint: s3Endpoint, s3Region: s3Region, absolute: { Paths.absolute($0) })
        do {
            for kind in storeBackends { if let store = try kind.parse(url, options) { return store } }
        } catch let e as StoreURLError { throw UserError(e.description) }
        // A scheme ubiq does not know, or a mistyped one ("s3:/bucket", "S3:bucket"): no
        // folder is made for it.
        if DirectoryBackend.hasOtherScheme(url) {
            throw UserError("unsupported store URL \(url): use dir:PATH or s3://BUCKET/PREFIX (a folder whose name has a colon: dir:\(url))")
        }
        throw UserError("unsupported store URL \(url): use dir:PATH or s3://BUCKET/PREFIX")
    }

    /// Opens the store (one that keeps an index of itself keeps it at `indexPath`).
    static func openStore(_ store: any StoreBackend, indexPath: String, logger: Logger, fullListingInterval: Double = 300,
                          mustExist: Bool = false) throws -> OpenedStore {
        let how = StoreOpening(indexPath: indexPath, logger: logger, fullListingInterval: fullListingInterval, mustExist: mustExist)
        do { return try runBlocking { try await store.open(how) } } catch let e as StoreURLError { throw UserError(e.description) }
    }

    /// "500M", "20G", "1.5T", "4096" (bytes), binary units.
    static func parseSize(_ text: String) -> Int64? {
        let t = text.trimmingCharacters(in: .whitespaces).uppercased()
        let units: [Character: Double] = ["K": 1024, "M": 1_048_576, "G": 1_073_741_824, "T": 1_099_511_627_776]
        var number = t
        var mult: Double = 1
        if let last = t.last, let u = units[last] { mult = u; number = String(t.dropLast()) }
        if number.hasSuffix("I") || number.hasSuffix("B") { return nil }
        // Not NaN, not negative, and within what a byte count holds ("inf" and "1e30G" are
        // numbers to Double, and would trap as a whole number).
        guard let v = Double(number), v >= 0, v * mult < Double(Int64.max) else { return nil }
        return Int64(v * mult)
    }

    static func inPath(_ tool: String) -> Bool {
        let dirs = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":")
        return dirs.contains { access("\($0)/\(tool)", X_OK) == 0 }
    }

    /// Fails unless `path` is a writable directory, or could be created as one.
    static func checkDirectory(_ path: String, what: String) throws {
        var isDir: ObjCBool = false
        var probe = path
        while !FileManager.default.fileExists(atPath: probe, isDirectory: &isDir) {
            probe = (probe as NSString).deletingLastPathComponent
        }
        guard isDir.boolValue else {
            throw UserError(probe == path ? "\(what) \(path) is not a directory" : "cannot create \(what) \(path): \(probe) is not a directory")
        }
        if access(probe, W_OK | X_OK) != 0 {
            throw UserError("\(what) \(path) is not writable (\(probe): \(String(cString: strerror(errno))))")
        }
    }

    static func createDirectory(_ path: String, what: String, mode: Int) throws {
        if FileManager.default.fileExists(atPath: path) { return }
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: mode])
        } catch {
            throw UserError("cannot create \(what) \(path): \(error.localizedDescription)")
        }
    }
}

/// One daemon per state directory: an flock on `<state>/lock` holding the pid.
enum StateLock {
    /// Whether a daemon holds the lock of `dir` (nil: the lock cannot be opened to tell).
    static func isHeld(_ dir: String) -> Bool? {
        let fd = open(dir + "/lock", O_RDONLY | O_CLOEXEC)
        if fd < 0 { return errno == ENOENT ? false : nil }
        defer { close(fd) }
        if flock(fd, LOCK_EX | LOCK_NB) == 0 { flock(fd, LOCK_UN); return false }
        return true
    }

    static func holder(_ dir: String) -> Int32? {
        let fd = open(dir + "/lock", O_RDONLY | O_CLOEXEC)
        if fd < 0 { return nil }
        defer { close(fd) }
        if flock(fd, LOCK_EX | LOCK_NB) == 0 { flock(fd, LOCK_UN); return nil }
        return lines(dir).first.flatMap { Int32($0.trimmingCharacters(in: .whitespaces)) } ?? -1
    }

    /// The lock file's lines: the holder's pid, then `unmountedMark` once its mount is gone.
    private static func lines(_ dir: String) -> [Substring] {
        ((try? String(contentsOfFile: dir + "/lock", encoding: .utf8)) ?? "").split(separator: "\n")
    }

    /// What the holder writes below its pid once its mount is gone and it only uploads what is
    /// pending before it exits (`markUnmounted`).
    static let unmountedMark = "unmounted"

    /// Says in the lock file (`fd`, from `acquire`) that this daemon's mount is gone: a mount
    /// of the same state may wait for it to exit (`waitForUnmounted`).
    static func markUnmounted(_ fd: Int32) {
        let line = "\(unmountedMark)\n"
        _ = line.withCString { pwrite(fd, $0, strlen($0), off_t("\(getpid())\n".utf8.count)) }
    }

    /// Whether the holder of `dir`'s lock said its mount is gone.
    static func holderUnmounted(_ dir: String) -> Bool {
        lines(dir).dropFirst().first == Substring(unmountedMark)
    }

    /// A mount of `dir` right after its last one was unmounted: that daemon still holds the
    /// state while it uploads what is pending (up to its drain timeout). Waits for it to exit,
    /// at most `seconds`, saying so once on standard error; returns the holder that is still
    /// there (nil: free).
    static func waitForUnmounted(_ dir: String, seconds: Double) -> Int32? {
        guard let first = holder(dir) else { return nil }
        guard holderUnmounted(dir) else { return first }
        FileHandle.standardError.write(Data("ubiq: waiting for the last mount of this state (pid \(first)) to finish its uploads\n".utf8))
        let end = Deadline(in: seconds)
        while !end.passed {
            usleep(50_000)
            guard let h = holder(dir) else { return nil }
            if !holderUnmounted(dir) { return h }
        }
        return holder(dir)
    }

    /// Takes the lock for this process; returns the fd to keep open, or nil if held.
    static func acquire(_ dir: String) -> Int32? {
        let fd = open(dir + "/lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        if fd < 0 { return nil }
        if flock(fd, LOCK_EX | LOCK_NB) != 0 { close(fd); return nil }
        ftruncate(fd, 0)
        let pid = "\(getpid())\n"
        _ = pid.withCString { write(fd, $0, strlen($0)) }
        return fd
    }
}

/// `--bwlimit`: bytes a second each way (nil: no limit that way), as rclone's: `RATE` for both,
/// `UP:DOWN` for each; `0` or `off` for none.
struct Bandwidth: Equatable {
    var up: Int64?
    var down: Int64?
    /// As given, for the daemon's command line.
    var text: String

    static func parse(_ text: String) -> Bandwidth? {
        func rate(_ t: Substring) -> Int64?? {
            let s = t.trimmingCharacters(in: .whitespaces)
            if s == "off" { return .some(nil) }
            guard let v = MountPlan.parseSize(s) else { return nil }
            return .some(v == 0 ? nil : v)
        }
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard (1 ... 2).contains(parts.count), let up = rate(parts[0]), let down = rate(parts[parts.count - 1]) else { return nil }
        return Bandwidth(up: up, down: down, text: text)
    }
}
