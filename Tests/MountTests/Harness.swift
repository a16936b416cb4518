import Foundation
import Testing
import TestSupport

/// The package root, from this file's path (Tests/MountTests/Harness.swift).
let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

/// The `ubiq` binary under test: $UBIQ_BIN, or the debug build.
let ubiqBinary: String = ProcessInfo.processInfo.environment["UBIQ_BIN"]
    ?? packageRoot.appendingPathComponent(".build/debug/ubiq").path

struct ShellResult {
    var status: Int32
    var out: String
    var err: String
}

/// Runs `script` with bash, in `cwd`, with `env` added; waits at most `timeout` seconds.
@discardableResult
func shell(_ script: String, cwd: String? = nil, env: [String: String] = [:], timeout: TimeInterval = 300) -> ShellResult {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/bin/bash")
    p.arguments = ["-c", "set -o pipefail\n" + script]
    if let cwd { p.currentDirectoryURL = URL(fileURLWithPath: cwd) }
    var e = ProcessInfo.processInfo.environment
    for (k, v) in env { e[k] = v }
    p.environment = e
    let outURL = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-sh-\(UUID().uuidString)")
    let errURL = outURL.appendingPathExtension("err")
    FileManager.default.createFile(atPath: outURL.path, contents: nil)
    FileManager.default.createFile(atPath: errURL.path, contents: nil)
    defer { try? FileManager.default.removeItem(at: outURL); try? FileManager.default.removeItem(at: errURL) }
    p.standardOutput = try? FileHandle(forWritingTo: outURL)
    p.standardError = try? FileHandle(forWritingTo: errURL)
    p.standardInput = FileHandle.nullDevice
    do { try p.run() } catch { return ShellResult(status: -1, out: "", err: "\(error)") }
    waitUntil(seconds: timeout, every: 0.01) { !p.isRunning }
    if p.isRunning { p.terminate(); usleep(100_000); kill(p.processIdentifier, SIGKILL) }
    p.waitUntilExit()
    let out = (try? String(contentsOf: outURL, encoding: .utf8)) ?? ""
    let err = (try? String(contentsOf: errURL, encoding: .utf8)) ?? ""
    return ShellResult(status: p.terminationStatus, out: out, err: err)
}

/// A real ubiq mount in a temporary directory: store, state and mount point
/// of its own. Always call `cleanup()` (in a `defer`): it unmounts even when
/// the test failed half-way, and stops the daemon.
final class MountFixture: @unchecked Sendable {
    let base: String
    let mnt: String
    /// The store's directory, or its s3:// address.
    let store: String
    let state: String
    /// XDG dirs of the fixture, so tests never touch the user's own.
    let env: [String: String]

    /// Extra mount arguments (e.g. "-o allow_other").
    let extra: String

    /// What `ubiq mount` printed, the last time.
    private(set) var mountSaid = ""

    /// The state directory is a tmpfs of this many MiB (a small disk that fills up), or with
    /// `stateDiskExt4` an ext4 of that size on a loop device (a disk that keeps what a failed
    /// call took, as tmpfs does not).
    let stateDiskMiB: Int?

    init(store: String? = nil, name: String = "mnt", extra: String = "", stateDiskMiB: Int? = nil,
         stateDiskExt4: Bool = false, daemonEnv: [String: String] = [:]) throws {
        self.extra = extra
        self.stateDiskMiB = stateDiskMiB
        base = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-mt-\(UUID().uuidString.prefix(8))").path
        mnt = base + "/" + name
        self.store = store ?? base + "/store"
        state = base + "/state"
        env = ["XDG_STATE_HOME": base + "/xdg-state", "XDG_DATA_HOME": base + "/xdg-data"].merging(daemonEnv) { a, _ in a }
        try FileManager.default.createDirectory(atPath: mnt, withIntermediateDirectories: true)
        // A new store is made only where asked: in a folder made for it (or with --create-store).
        if store == nil { try FileManager.default.createDirectory(atPath: self.store, withIntermediateDirectories: true) }
        if let mib = stateDiskMiB {
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
            let r = stateDiskExt4
                ? shell("truncate -s \(mib)M '\(base)/state.img' && mkfs.ext4 -q -F '\(base)/state.img' && mount -o loop '\(base)/state.img' '\(state)'")
                : shell("mount -t tmpfs -o size=\(mib)m ubiq-test-state '\(state)'")
            if r.status != 0 { throw FixtureError("cannot mount a small disk for the state: \(r.err)") }
        }
        try mount()
    }

    func mount() throws {
        let url = store.hasPrefix("s3://") ? store : "dir:" + store
        let r = ubiq("mount --store \(url) --state \(state) \(extra) \(mnt)")
        mountSaid = r.out
        if r.status != 0 {
            cleanup()
            throw FixtureError("mount failed: \(r.err)\(r.out)")
        }
    }

    @discardableResult
    func ubiq(_ args: String, timeout: TimeInterval = 120) -> ShellResult {
        shell("\(ubiqBinary) \(args)", env: env, timeout: timeout)
    }

    /// Runs a script inside the mount. Leave nothing running in the background (`cmd &`): it
    /// inherits the script's output, and Foundation's `Process` waits for that to close, so the
    /// call hangs until its timeout. Run a long-lived process as a `Process` of its own
    /// (`start`).
    @discardableResult
    func sh(_ script: String, timeout: TimeInterval = 300) -> ShellResult {
        shell(script, cwd: mnt, env: env, timeout: timeout)
    }

    /// Starts `command` inside the mount as a process of its own, with the mount's
    /// environment: one that runs while the test goes on (see `sh`). The caller ends it.
    func start(_ command: String) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/bash")
        p.arguments = ["-c", "cd \(mnt) && exec \(command)"]
        p.environment = ProcessInfo.processInfo.environment.merging(env) { $1 }
        try p.run()
        return p
    }

    func unmount() -> ShellResult { ubiq("unmount \(mnt)") }

    /// Everything `ubiq status` says of `path` (in the mount), for a failure's message.
    func statusOf(_ path: String) -> String { ubiq("status --json \(mnt)/\(path)").out }

    var isMounted: Bool {
        let info = readWhole("/proc/self/mountinfo")
        return info.split(separator: "\n").contains { $0.split(separator: " ").dropFirst(4).first.map(String.init) == mnt }
    }

    var daemonPID: Int32? {
        guard let text = try? String(contentsOfFile: state + "/lock", encoding: .utf8) else { return nil }
        // Its pid, then "unmounted" once its mount is gone (it uploads what is pending, then exits).
        return text.split(separator: "\n").first.flatMap { Int32($0.trimmingCharacters(in: .whitespaces)) }
    }

    /// Sends `signal` to the daemon and waits up to `seconds` for it to exit; true if it did.
    @discardableResult
    func signalDaemon(_ signal: Int32, waitSeconds seconds: Double = 10) -> Bool {
        guard let pid = daemonPID else { return false }
        kill(pid, signal)
        waitUntil(seconds: seconds, every: 0.01) { kill(pid, 0) != 0 }
        return kill(pid, 0) != 0
    }

    func cleanup() {
        // Tests that need uploads finished unmount themselves; cleanup does not wait for them.
        if isMounted { _ = ubiq("unmount --timeout 2 \(mnt)") }
        if isMounted { shell("fusermount3 -u -z '\(mnt)' || umount -l '\(mnt)'") }
        if let pid = daemonPID, kill(pid, 0) == 0 {
            kill(pid, SIGKILL)
            usleep(100_000)
        }
        if stateDiskMiB != nil { shell("umount '\(state)' || umount -l '\(state)'") }
        try? FileManager.default.removeItem(atPath: base)
    }
}

struct FixtureError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// Checks a shell step and shows its output when it fails.
/// Runs `script` in `m` until it succeeds, up to `seconds` (uploads, another device's next
/// look at the store, retries take a moment). Returns the last result.
func eventually(_ m: MountFixture, _ script: String, seconds: Double = 20) -> ShellResult {
    var r = m.sh(script)
    waitUntil(seconds: seconds, every: 0.2) {
        if r.status != 0 { r = m.sh(script) }
        return r.status == 0
    }
    return r
}

func expectOK(_ r: ShellResult, _ what: String = "", sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(r.status == 0, "\(what) failed (\(r.status)): \(r.err)\(r.out)", sourceLocation: sourceLocation)
}

/// A file read to its end with read(2) (Foundation reads a /proc file only as far as stat says).
func readWhole(_ path: String) -> String {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    if fd < 0 { return "" }
    defer { close(fd) }
    var out: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buf.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { break }
        out += buf[..<n]
    }
    return String(decoding: out, as: UTF8.self)
}
