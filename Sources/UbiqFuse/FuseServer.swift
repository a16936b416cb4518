import CFuse
import CUbiqFuse
import Foundation
import UbiqClock
import Logging
import Synchronization
import UbiqFS

/// Kernel options ubiq negotiates. See docs/posix.md, "Kernel options".
public struct FuseOptions: Sendable {
    /// Largest read/write request (the kernel caps it at its own maximum).
    public var maxWrite: UInt32 = 1 << 20
    /// Seconds the kernel may cache attributes and names (missing names too). Every change
    /// that does not come through the kernel (another device's, a download that finished, an
    /// eviction) tells the kernel to drop what it cached, so a cached answer stays right;
    /// the timeout only bounds how long one that raced such a change could stay. A file not
    /// all here is kept a second at most (`attrTimeout(_:)`).
    public var attrTimeout: Double = 30
    public var entryTimeout: Double = 30
    /// Extra `-o` mount options (e.g. allow_other).
    public var mountOptions: [String] = []
    public var maxThreads: UInt32 = 16
    /// Count and time every operation, for the log at unmount (`operationStats`).
    public var operationStats = false
    public init() {}
}

public enum FuseError: Error, CustomStringConvertible {
    /// What libfuse said of it (an unknown option, say).
    case sessionFailed(String)
    case mountFailed(String)
    public var description: String {
        switch self {
        case .sessionFailed(let said) where !said.isEmpty: return "could not start a FUSE session: \(said)"
        case .sessionFailed: return "could not start a FUSE session (bad mount options?)"
        case .mountFailed(let m): return "could not mount at \(m) (is /dev/fuse usable and fusermount3 installed?)"
        }
    }
}

/// The FUSE binding: libfuse3 low-level operations ⇄ `FileSystem` calls.
/// Thin by design: decode the request, call the core, reply, map the error.
public final class FuseServer: @unchecked Sendable {
    let fs: FileSystem
    let logger: Logger
    let options: FuseOptions
    private(set) var session: OpaquePointer?
    private var mountpoint = ""
    /// Who checks modes and owners (set at mount).
    private(set) var checks = PermissionChecks.kernel
    /// Replies still to be sent from other threads.
    private let owed = Mutex(0)

    public init(fs: FileSystem, options: FuseOptions, logger: Logger) {
        self.fs = fs
        self.options = options
        self.logger = logger
    }

    /// Creates the session and mounts it at `path`.
    public func mount(at path: String, fsname: String) throws {
        OpStats.enabled = options.operationStats
        var ops = fuse_lowlevel_ops()
        FuseOps.install(&ops)
        checks = PermissionChecks(uid: getuid(), mountOptions: options.mountOptions)
        var opts = ["fsname=\(fsname.replacingOccurrences(of: ",", with: "_"))", "subtype=ubiq"]
        if checks == .kernel { opts.insert("default_permissions", at: 0) }
        opts += options.mountOptions
        let argv = ["ubiq", "-o", opts.joined(separator: ",")]
        var cargs = argv.map { strdup($0) }
        defer { cargs.forEach { free($0) } }
        let me = Unmanaged.passUnretained(self).toOpaque()
        Self.listenToLibfuse(logger)
        guard let se = cargs.withUnsafeMutableBufferPointer({ buf in
            ubiq_fuse_session_new(Int32(buf.count), buf.baseAddress, &ops, me)
        }) else {
            throw FuseError.sessionFailed(Self.libfuseSaid.withLock { $0.joined(separator: "; ") })
        }
        if fuse_session_mount(se, path) != 0 {
            fuse_session_destroy(se)
            throw FuseError.mountFailed(path)
        }
        // The device's traffic through ubiq's hooks, for FUSE_HANDLE_KILLPRIV_V2 and a mount
        // that is its mounter's alone (cubiqfuse.h).
        let alone = checks == .kernel ? -1 : Int(getuid())
        if cubiqfuse_install_io(se, 1, alone) != 0 {
            if checks != .kernel {
                fuse_session_unmount(se)
                fuse_session_destroy(se)
                throw FuseError.sessionFailed("could not hook the FUSE device, which a mount without -o default_permissions needs (mount with it)")
            }
            logger.warning("could not hook the FUSE device: the kernel keeps asking for security.capability before each write")
        }
        switch checks {
        case .rootOnly:
            logger.info("root's own mount: only root enters, so the kernel's permission check (default_permissions) is left out")
        case .daemon:
            logger.info("a user's own mount: ubiq checks modes and owners itself, in place of the kernel (default_permissions)")
        case .kernel:
            break
        }
        session = se
        mountpoint = path
        fs.attach(kernel: self)
    }

    /// Who checks modes and owners on this mount (docs/kernel-options.md, `default_permissions`).
    public enum PermissionChecks: Sendable, Equatable {
        /// The kernel (`default_permissions`): a mount others enter (`allow_other`,
        /// `allow_root`), or one mounted with the option.
        case kernel
        /// Nobody: root's own mount. Only processes whose uids and gids are all root's enter
        /// (the kernel refuses the rest), and root passes every mode and owner check but
        /// running a file with no x bit, which the kernel checks without the option too. A
        /// root process that took another file-system uid (setfsuid) is refused by the FUSE
        /// device's hook instead (cubiqfuse.h).
        case rootOnly
        /// ubiq, as each request comes (`FuseServer.permit`): a user's own mount. Only the
        /// user's processes enter; the check still matters (a file made read-only, another
        /// user's file from another device, a supplementary group).
        case daemon

        /// The kernel's check costs a round trip: it asks for a folder's attributes again
        /// after each create and unlink in it, before its next check (rm -rf of 10,000 files:
        /// 10,000 GETATTRs). So only a mount others enter keeps it.
        public init(uid: uid_t, mountOptions: [String]) {
            if mountOptions.contains(where: { ["allow_other", "allow_root", "default_permissions"].contains($0) }) {
                self = .kernel
            } else {
                self = uid == 0 ? .rootOnly : .daemon
            }
        }
    }

    /// What libfuse said since `listenToLibfuse` (the last few lines), for an error that names
    /// its cause ("unknown option(s): `-o nonsenseopt'") instead of guessing.
    static let libfuseSaid = Mutex<[String]>([])
    private static let libfuseLogger = Mutex<Logger?>(nil)
    private static let libfusePending = Mutex("")

    /// Sends libfuse's own messages to `logger` (ubiq.log) and keeps the last few, instead of
    /// letting them go to a standard error nobody reads.
    static func listenToLibfuse(_ logger: Logger) {
        libfuseLogger.withLock { $0 = logger }
        libfuseSaid.withLock { $0 = [] }
        fuse_set_log_func { level, fmt, args in
            guard let fmt, let args else { return }
            var buf = [CChar](repeating: 0, count: 1024)
            _ = vsnprintf(&buf, buf.count, fmt, args)
            // libfuse writes a line in pieces ("unknown option(s): `", "-o ", "x'", "\n").
            let lines = FuseServer.libfusePending.withLock { pending -> [String] in
                pending += String(cString: buf)
                guard let cut = pending.lastIndex(of: "\n") else { return [] }
                let done = pending[..<cut].split(separator: "\n").map(String.init)
                pending = String(pending[pending.index(after: cut)...])
                return done
            }
            let logger = FuseServer.libfuseLogger.withLock { $0 }
            for line in lines.map({ $0.trimmingCharacters(in: .whitespaces) }) where !line.isEmpty {
                FuseServer.libfuseSaid.withLock { said in
                    said.append(line.hasPrefix("fuse: ") ? String(line.dropFirst(6)) : line)
                    if said.count > 5 { said.removeFirst() }
                }
                if level.rawValue <= FUSE_LOG_ERR.rawValue { logger?.error("libfuse: \(line)") } else { logger?.info("libfuse: \(line)") }
            }
        }
    }

    /// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and every
    /// thread it starts afterwards. Call first thing in the daemon: `run()`
    /// unblocks them in the loop thread only, so libfuse's handler always
    /// interrupts the thread that waits for the loop to end.
    public static func blockTerminationSignals() {
        var set = sigset_t()
        sigemptyset(&set)
        for s in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&set, s) }
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    /// Serves requests until unmounted or `exit()`; returns libfuse's status.
    public func run() -> Int32 {
        guard let se = session else { return -1 }
        fuse_set_signal_handlers(se)
        var set = sigset_t()
        sigemptyset(&set)
        for s in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&set, s) }
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
        let r = ubiq_fuse_loop_mt(se, 4, options.maxThreads)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        fuse_remove_signal_handlers(se)
        return r
    }

    /// Asks the loop to end (safe from any thread).
    public func exit() {
        if let se = session { fuse_session_exit(se) }
    }

    /// Ends the session. Replies still owed (reads waiting for the store: call
    /// `Materializer.answerAllWaiting` first) are waited for, as a reply needs the session;
    /// if some never come, the session is left, not freed under them.
    public func unmount() {
        guard let se = session else { return }
        // Before the device is closed: a late reply would go to whatever file gets its number.
        let deadline = Deadline(in: 10)
        while owed.withLock({ $0 }) > 0 && !deadline.passed { usleep(10_000) }
        fuse_session_unmount(se)
        let left = owed.withLock { $0 }
        if left > 0 {
            logger.warning("\(left) replies still owed at unmount: the FUSE session is left as it is")
        } else {
            fuse_session_destroy(se)
        }
        session = nil
    }

    /// Runs `body`, which answers `req`: here, or when `later` (it waits for the store) on
    /// another thread, so the worker goes back to the kernel for the next request.
    func answer(_ req: fuse_req_t?, later: Bool, _ body: @escaping @Sendable (fuse_req_t?) -> Void) {
        guard later else { body(req); return }
        let p = replyLater(req)
        // A thread of its own (these are few): Dispatch's shared pool grows slowly on Linux
        // when its threads block, and other work waits behind them.
        let t = Thread { [self] in
            body(p.req)
            replied(p)
        }
        t.name = "ubiq-slow-request"
        t.start()
    }

    /// A request answered later, from another thread (`replyLater`, then `replied`).
    struct PendingReply: @unchecked Sendable {
        let req: fuse_req_t?
    }

    /// Counts a reply owed beyond the request's own call.
    func replyLater(_ req: fuse_req_t?) -> PendingReply {
        owed.withLock { $0 += 1 }
        return PendingReply(req: req)
    }

    func replied(_ p: PendingReply) {
        owed.withLock { $0 -= 1 }
    }

    /// Per-operation counts and times, when `options.operationStats` is on.
    public var operationStats: String? { OpStats.enabled ? OpStats.shared.report() : nil }

    static func from(_ req: fuse_req_t?) -> FuseServer {
        Unmanaged<FuseServer>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue()
    }

    // MARK: - Replies

    func stat(_ a: Attributes) -> stat {
        var st = Glibc.stat()
        st.st_ino = UInt(a.ino)
        st.st_mode = a.mode
        st.st_nlink = UInt(a.nlink)
        st.st_uid = a.uid
        st.st_gid = a.gid
        st.st_rdev = UInt(a.rdev)
        st.st_size = Int(a.size)
        st.st_blocks = Int(a.blocks)
        st.st_blksize = 65536
        ubiq_stat_set_times(&st, a.atime, a.mtime, a.ctime)
        return st
    }

    /// How long the kernel may keep `a`: a file not all here (a placeholder, a download under
    /// way) changes its blocks as bytes arrive, so it is asked again after a second.
    func attrTimeout(_ a: Attributes) -> Double {
        a.mode & 0o170000 == 0o100000 && a.blocks * 512 < a.size ? min(1, options.attrTimeout) : options.attrTimeout
    }

    /// The kernel's entry for `a`, a name it may keep `timeout` seconds (`entryTimeout(in:_:)`).
    func entry(_ a: Attributes, timeout: Double) -> fuse_entry_param {
        var e = fuse_entry_param()
        e.ino = a.ino
        e.generation = 1
        e.attr = stat(a)
        e.attr_timeout = attrTimeout(a)
        e.entry_timeout = timeout
        return e
    }

    /// Answers with the item `body` made or found and how long the kernel may keep its name.
    func replyEntry(_ req: fuse_req_t?, _ body: () throws -> (Attributes, timeout: Double)) {
        do {
            let (a, timeout) = try body()
            var e = entry(a, timeout: timeout)
            if fuse_reply_entry(req, &e) != 0 {
                // The kernel did not take the reference (interrupted): undo the lookup count.
                fs.forget(e.ino, 1)
            } else {
                fs.kernelLookedUp(e.ino)
            }
        } catch { replyError(req, error) }
    }

    func replyAttr(_ req: fuse_req_t?, _ body: () throws -> Attributes) {
        do {
            let a = try body()
            var st = stat(a)
            fuse_reply_attr(req, &st, attrTimeout(a))
        } catch { replyError(req, error) }
    }

    func replyOK(_ req: fuse_req_t?, _ body: () throws -> Void) {
        do {
            try body()
            fuse_reply_err(req, 0)
        } catch { replyError(req, error) }
    }

    func replyError(_ req: fuse_req_t?, _ error: Error) {
        let code = Self.errno(error)
        if code == EIO || code == EBUSY { logger.warning("request failed: \(error)") }
        fuse_reply_err(req, code)
    }

    /// The one place where core errors become errno values.
    static func errno(_ error: Error) -> Int32 {
        guard let e = error as? FSError else { return EIO }
        switch e {
        case .notFound: return ENOENT
        case .exists: return EEXIST
        case .notEmpty: return ENOTEMPTY
        case .notDirectory: return ENOTDIR
        case .isDirectory: return EISDIR
        case .nameTooLong: return ENAMETOOLONG
        case .invalid: return EINVAL
        case .notPermitted: return EPERM
        case .accessDenied: return EACCES
        case .noAttribute: return ENODATA
        case .notSupported: return EOPNOTSUPP
        case .range: return ERANGE
        case .busy: return EBUSY
        case .noSpace: return ENOSPC
        case .tooManyLinks: return EMLINK
        case .badHandle: return EBADF
        case .fileTooLarge: return EFBIG
        // A claim that could not be had in time: the item is busy with sync work.
        case .timedOut: return EBUSY
        // Evict of a file whose changes are not uploaded yet: try again once they are. Not
        // EAGAIN, which the kernel turns into EOPNOTSUPP on its way back from setxattr(2).
        case .notUploaded: return EINPROGRESS
        // The kernel's one retry of an open looks the name up again (LOOKUP_REVAL).
        case .stale: return ESTALE
        case .io: return EIO
        case .system(let code): return code
        }
    }
}

/// A copy of libfuse's `fuse_file_info`, to answer with from another thread.
struct FileInfo: @unchecked Sendable {
    let value: fuse_file_info
    init(_ value: fuse_file_info) { self.value = value }
}

func name(_ p: UnsafePointer<CChar>?) -> [UInt8] {
    guard let p else { return [] }
    return Array(UnsafeRawBufferPointer(start: p, count: strlen(p)))
}

func caller(_ req: fuse_req_t?) -> Caller {
    guard let ctx = fuse_req_ctx(req) else { return .root }
    return Caller(uid: ctx.pointee.uid, gid: ctx.pointee.gid, pid: ctx.pointee.pid)
}

/// Whether the request this worker thread read last asks the file system to clear setuid and
/// setgid (FUSE_HANDLE_KILLPRIV_V2; `always`: whatever the kernel flagged), with the caller's
/// groups for a setgid file its group may not execute (read then, before `req` is answered).
/// Call it on the thread that took `req`.
func setIDClearing(_ req: fuse_req_t?, always: Bool = false) -> SetIDClearing? {
    guard always || cubiqfuse_request_kills_suidgid() != 0 else { return nil }
    let who = credentials(req)
    return SetIDClearing { gid in who.uid == 0 || who.inGroup(gid) }
}

/// A request not answered yet, carried into a closure that runs before its answer.
struct Unanswered: @unchecked Sendable { let req: fuse_req_t? }

extension FuseServer: KernelNotifier {
    public func invalidateInode(_ ino: UInt64, pages: Bool) {
        guard let se = session else { return }
        // A negative offset: the attributes only.
        _ = fuse_lowlevel_notify_inval_inode(se, ino, pages ? 0 : -1, 0)
    }

    public func invalidateEntry(_ parent: UInt64, _ name: [UInt8]) {
        guard let se = session else { return }
        _ = name.withUnsafeBufferPointer { buf in
            buf.withMemoryRebound(to: CChar.self) { fuse_lowlevel_notify_inval_entry(se, parent, $0.baseAddress, buf.count) }
        }
    }
}
