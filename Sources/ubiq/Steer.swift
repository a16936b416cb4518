import ArgumentParser
import CUbiq
import Foundation
import UbiqClock
import UbiqControl
import UbiqState
import UbiqSync

/// The paths given, resolved, each checked to be inside a ubiq mount, as Strings (for the
/// commands on one file or a whole mount; `BytePath.inMounts` keeps names that are not UTF-8).
func pathsInMounts(_ paths: [String]) -> [String] {
    BytePath.inMounts(paths).map { String(decoding: $0.bytes, as: UTF8.self) }
}

/// Asks the daemon to send what waits and look at the store (`ubiq sync`; `full`: list it
/// whole); nil, or why it could not. Through its control socket where that is reached: a
/// `setfattr` of the path's `user.ubiq.action` (for whoever cannot reach the socket: another
/// user, with allow_other) has the kernel hold the path's lock until the daemon answers, so
/// while the store was listed no new name could be looked up or made in that folder.
func askToSync(_ path: String, control: ControlClient?, full: Bool) -> String? {
    // (The daemon serves its own user only: root, say, syncs another user's mount by the attribute.)
    var st = stat()
    if let control, stat(control.socketPath, &st) == 0, st.st_uid == getuid() {
        do { _ = try control.connection.request(.sync(full: full, wait: true), as: Done.self) } catch { return "\(error)" }
        return nil
    }
    let e = setAttribute(path, "user.ubiq.action", full ? "sync-full" : "sync")
    return e == 0 ? nil : e == EIO ? "the store could not be reached" : String(cString: strerror(e))
}

func setAttribute(_ path: String, _ name: String, _ value: String) -> Int32 {
    BytePath(bytes: Array(path.utf8)).setAttribute(name, value)
}

func getAttribute(_ path: String, _ name: String) -> String? {
    BytePath(bytes: Array(path.utf8)).attribute(name)
}

/// Sizes for people: 1.5 GiB, 300 MiB, 12 KiB, 80 B; one decimal below 10, rounded half to
/// even as printf's `%.1f` and `%.0f` did (by integers: `String(format:)` was a quarter of
/// `ubiq query`'s time for a million rows).
func humanBytes(_ n: Int64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var u = 0, unit: Int64 = 1
    while u < units.count - 1 && n / unit >= 1024 { unit *= 1024; u += 1 }
    if u == 0 { return "\(n) B" }
    func rounded(_ a: Int64, _ d: Int64) -> Int64 {
        let (q, r) = a.quotientAndRemainder(dividingBy: d)
        return 2 * r > d || (2 * r == d && q % 2 == 1) ? q + 1 : q
    }
    if n < 10 * unit {
        let tenths = rounded(n * 10, unit)
        return "\(tenths / 10).\(tenths % 10) \(units[u])"
    }
    return "\(rounded(n, unit)) \(units[u])"
}

/// A JSON object on one line (keys sorted, so lines are stable).
func jsonLine(_ object: [String: Any]) -> String {
    let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
    return String(decoding: data, as: UTF8.self)
}

/// `value` as one line of JSON, keys sorted.
func jsonLine<T: Encodable>(_ value: T) -> String { jsonText(value) ?? "{}" }

struct Download: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Download files, or everything under folders, so they are here offline.",
        discussion: prose("""
            Every file is queued first, and the downloads run in the background, several at a
            time. Without --wait the command returns once they are queued. With --wait it shows a
            progress bar on a terminal (bytes, rate, time left), a line per file as each is done
            otherwise, or with --json a JSON line per file:
              {"bytes":N,"path":"...","seconds":S,"size":N,
               "status":"downloaded"|"failed","error":"..."}
            (without --wait: {"path":"...","status":"queued"|"failed"}). Interrupted (Ctrl-C),
            --wait stops waiting and the downloads go on, as without it.

            Examples:
              ubiq download ~/Ubiquity/Photos
              ubiq download --wait ~/Ubiquity/report.pdf
            """))

    @Flag(help: "Wait until every file is downloaded, showing progress.")
    var wait = false

    @Flag(help: "A JSON line per file.")
    var json = false

    @Argument(help: "Files or folders in a ubiq mount.", completion: .file())
    var paths: [String]

    func run() throws {
        let started = Stopwatch()
        // Ctrl-C from here on is noted: the queueing goes on (it is quick), then the wait stops.
        if wait { Interrupt.catchIt() }
        // Queue everything first: an interrupted wait leaves what plain `download` would.
        var failed = 0
        var queued: [(path: BytePath, size: Int64)] = []
        // On a terminal, --wait shows the queueing as it goes (thousands of files take seconds).
        let showQueueing = wait && !json && isatty(1) != 0
        var shown = -1.0
        for root in BytePath.inMounts(paths) {
            let files = root.regularFiles()
            let isFolder = root.lstat().map { ($0.st_mode & S_IFMT) == S_IFDIR } ?? false
            var bytes: Int64 = 0, count = 0
            for f in files {
                let e = f.setAttribute("user.ubiq.action", "download")
                if e != 0 {
                    report(f.display, error: String(cString: strerror(e)))
                    failed += 1
                    continue
                }
                let size = f.lstat().map { Int64($0.st_size) } ?? 0
                queued.append((f, size))
                bytes += size
                count += 1
                if showQueueing && started.seconds - shown > 0.1 {
                    shown = started.seconds
                    FileHandle.standardOutput.write(Data("\r\u{1B}[Kqueueing \(queued.count) files for download".utf8))
                }
                if json && !wait { say(jsonLine(["path": f.display, "status": "queued"])) }
            }
            // A line for each path given: a folder's files are counted, not named (a folder of
            // 2,000 files said 2,000 lines).
            guard !wait, !json else { continue }
            if isFolder {
                say("downloading \(count) file\(count == 1 ? "" : "s") (\(humanBytes(bytes))) in \(root.display)")
            } else if count > 0 {
                say("downloading \(root.display)")
            }
        }
        if wait { failed += waitForAll(queued, since: started) }
        if failed > 0 { throw ExitCode.failure }
    }

    private func report(_ f: String, error: String, size: Int64 = 0, bytes: Int64 = 0, seconds: Double? = nil) {
        if json {
            var o: [String: Any] = ["path": f, "status": "failed", "error": error]
            if let seconds { o.merge(["size": size, "bytes": bytes, "seconds": seconds]) { a, _ in a } }
            say(jsonLine(o))
        } else {
            FileHandle.standardError.write(Data("ubiq: cannot download \(f): \(error)\n".utf8))
        }
    }

    /// Waits for every queued file, looking at all of them each round; returns how many failed.
    /// `started`: when the command started (its queueing is part of the time it reports).
    private func waitForAll(_ queued: [(path: BytePath, size: Int64)], since started: Stopwatch) -> Int {
        let total = queued.reduce(0) { $0 + $1.size }
        let bar = ProgressBar(total: total, files: queued.count, enabled: !json && isatty(1) != 0, since: started)
        var pending = Array(queued.indices)
        var have = [Int64](repeating: 0, count: queued.count)
        var failed = 0
        while !pending.isEmpty {
            var still: [Int] = []
            for (n, i) in pending.enumerated() {
                // Asked at each file: a look at thousands takes seconds (Ctrl-C waited for it).
                if Interrupt.caught {
                    bar.clear()
                    let left = still.count + pending.count - n
                    say("interrupted: \(left) of \(queued.count) files still downloading in the background")
                    Foundation.exit(130)
                }
                let (item, size) = queued[i]
                let f = item.display
                var error: String?
                let state = item.attribute("user.ubiq.downloading-status")
                if state == nil {
                    error = "no such file any more"
                } else if state != "not-downloaded" {
                    have[i] = size
                } else if let why = item.attribute("user.ubiq.downloading-error"), !why.isEmpty,
                          item.attribute("user.ubiq.downloading") == "1" {
                    error = why  // halted by a failure (retried 3 times already)
                } else {
                    have[i] = size * (Int64(item.attribute("user.ubiq.percent-downloaded") ?? "0") ?? 0) / 100
                    still.append(i)
                    continue
                }
                let secs = (started.seconds * 1000).rounded() / 1000
                if let error {
                    bar.clear()
                    report(f, error: error, size: size, bytes: have[i], seconds: secs)
                    failed += 1
                } else if json {
                    say(jsonLine(["path": f, "size": size, "bytes": size, "seconds": secs, "status": "downloaded"]))
                } else if !bar.enabled {
                    say("downloaded \(f) (\(size) bytes)")
                }
            }
            pending = still
            bar.update(done: have.reduce(0, +), file: pending.first.map { queued[$0].path.display } ?? "")
            if !pending.isEmpty { usleep(100_000) }
        }
        bar.finish()
        return failed
    }
}

/// Ctrl-C while waiting: noted, so the wait can say what goes on without it.
enum Interrupt {
    nonisolated(unsafe) private static var flag: sig_atomic_t = 0
    static var caught: Bool { flag != 0 }
    static func catchIt() {
        signal(SIGINT) { _ in Interrupt.flag = 1 }
    }
}

/// One line redrawn in place on a terminal: bar, percent, bytes, rate, time left.
final class ProgressBar {
    let total: Int64
    let files: Int
    let enabled: Bool
    /// Since the command started: its rate and its summary count the queueing too.
    let start: Stopwatch
    private var lastDraw: Double = -1

    init(total: Int64, files: Int, enabled: Bool, since start: Stopwatch = Stopwatch()) {
        self.total = total; self.files = files; self.enabled = enabled; self.start = start
    }

    func update(done: Int64, file: String) {
        guard enabled, lastDraw < 0 || start.seconds - lastDraw > 0.1 || done >= total else { return }
        lastDraw = start.seconds
        let secs = max(0.001, start.seconds)
        let rate = Double(done) / secs
        // More than the total when a file grew while it came down: a full bar.
        let frac = total > 0 ? min(1, max(0, Double(done) / Double(total))) : 1
        let width = 24
        let filled = Int(frac * Double(width))
        let eta = rate > 0 ? Int((Double(total - done) / rate).rounded()) : 0
        let name = (file as NSString).lastPathComponent
        let line = "[" + String(repeating: "=", count: filled) + String(repeating: " ", count: width - filled) + "] "
            + String(format: "%3d%% ", Int(frac * 100)) + "\(humanBytes(done))/\(humanBytes(total)) "
            + "\(humanBytes(Int64(rate)))/s ETA \(eta)s  \(name.prefix(30))"
        FileHandle.standardOutput.write(Data(("\r\u{1B}[K" + line).utf8))
    }

    func clear() { if enabled { FileHandle.standardOutput.write(Data("\r\u{1B}[K".utf8)) } }

    func finish() {
        guard enabled else { return }
        clear()
        say("downloaded \(files) files, \(humanBytes(total)), in \(String(format: "%.1f", start.seconds)) s")
    }
}

struct Sync: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Bring in other devices' changes now, and start pending uploads.",
        discussion: prose("""
            The mount also looks for changes on its own, every few seconds (mount --poll-interval). \
            On S3, other devices' changes come from the bucket's change log; --full also lists the \
            whole bucket, for objects other tools put there (the mount does that on its own every \
            --full-listing-interval seconds).

            Example:
              ubiq sync ~/Ubiquity
            """))

    @Flag(help: "Also list the whole store (S3: objects other tools put in the bucket).")
    var full = false

    @Argument(help: "A path in a ubiq mount (the whole mount is synced).", completion: .file())
    var path: String

    func run() throws {
        guard let p = pathsInMounts([path]).first else { return }
        let mount = Mounts.ubiqMount(containing: p) ?? p
        let control = ControlClient.reach(mount: mount)
        defer { control?.close() }
        // Each sync waits at most a minute for its uploads (a request of the mount, or of the
        // daemon): asked again while fewer items wait than the time before, so a big move
        // (10,000 copies) is waited for to its end, and a store that takes nothing more is not.
        var waiting = Int.max
        var full = self.full
        while true {
            if let why = askToSync(p, control: control, full: full) {
                // Offline: what the user asks ("is everything up?") answered at once, from the
                // mount's own attributes.
                let uploading = getAttribute(mount, "user.ubiq.items-uploading") ?? "?"
                fail("cannot sync \(path): \(why)\n  the store was \(Status.reached(getAttribute(mount, "user.ubiq.store-reached") ?? "")); "
                     + "\(uploading) changes wait to upload")
            }
            let before = waiting
            waiting = Int(getAttribute(mount, "user.ubiq.items-uploading") ?? "0") ?? 0
            if waiting == 0 || waiting >= before { break }
            full = false  // the whole store was listed once already
        }
        // Never "synced" while something is not in the store: name each, with why.
        let failed = Int(getAttribute(mount, "user.ubiq.items-errors") ?? "0") ?? 0
        // Files kept on this device only (a name the store cannot hold) count too: the root's
        // status says when there may be some (only a download outranks them there).
        let rootStatus = SyncStatus(rawValue: getAttribute(mount, "user.ubiq.status") ?? "")
        if waiting + failed == 0, let s = rootStatus, s <= .placeholder {
            print("synced \(mount)")
            return
        }
        var lines: [String] = []
        if let c = control {
            var spec = QuerySpec()
            spec.status = [.uploading, .error, .local]
            spec.limit = 50
            var items: [QueryRow] = []
            try? c.connection.query(scope: "", spec: spec) { items.append($0) }
            for item in items where item.type != "folder" {
                // The path's own bytes: a name that is not UTF-8 is found, and shown as \xNN.
                let full = BytePath(bytes: Array(mount.utf8) + [UInt8(ascii: "/")] + (item.rawPath ?? Array(item.path.utf8)))
                let why = full.attribute("user.ubiq.uploading-error").flatMap { $0.isEmpty ? nil : $0 }
                    ?? full.attribute("user.ubiq.downloading-error").flatMap { $0.isEmpty ? nil : $0 }
                let rel = item.rawPath.map { BytePath(bytes: $0).display } ?? item.path
                lines.append("  \(item.status.rawValue) \(rel)\(why.map { ": " + $0 } ?? "")")
            }
        }
        let localOnly = lines.filter { $0.hasPrefix("  local ") }.count
        if waiting + failed + localOnly == 0 {
            print("synced \(mount)")
            return
        }
        print("not synced: \(waiting) items with changes not yet in the store, \(failed) with errors, \(localOnly) kept on this device only, in \(mount)")
        for l in lines { print(l) }
        throw ExitCode(1)
    }
}

struct Evict: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Free the local space of files (or of everything under folders); they stay visible.",
        discussion: prose("""
            Evicted files become placeholders again: listed with their true size, downloaded when opened.
            Refused, and named, losing nothing: files that are open, files whose changes are not yet in
            the store, and pinned files.

            Examples:
              ubiq evict ~/Ubiquity/Videos
            """))

    @Argument(help: "Files or folders in a ubiq mount.", completion: .file())
    var paths: [String]

    func run() throws {
        var refused = 0
        var evicted = 0
        for root in BytePath.inMounts(paths) {
            // A folder's refusals are said a line a reason, naming a few (a pinned folder of
            // 2,000 files said 2,000 lines); a file given by itself is named.
            var why: [String: [String]] = [:]
            var order: [String] = []
            let folder = root.lstat().map { ($0.st_mode & S_IFMT) == S_IFDIR } ?? false
            let prefix = root.bytes.count + (root.bytes.last == UInt8(ascii: "/") ? 0 : 1)
            for item in root.regularFiles() {
                let e = item.setAttribute("user.ubiq.action", "evict")
                if e == 0 { evicted += 1; continue }
                refused += 1
                let reason: String
                switch e {
                case EBUSY: reason = "open, or still downloading"
                case EINPROGRESS: reason = "changes not yet uploaded"
                case EPERM: reason = "pinned (keep downloaded)"
                default: reason = String(cString: strerror(e))
                }
                if !folder { print("ubiq: not evicted: \(item.display): \(reason)"); continue }
                if why[reason] == nil { order.append(reason) }
                why[reason, default: []].append(BytePath(bytes: Array(item.bytes.dropFirst(prefix))).display)
            }
            for reason in order {
                let names = why[reason] ?? []
                let shown = names.prefix(3).joined(separator: ", ") + (names.count > 3 ? " and \(names.count - 3) more" : "")
                print("ubiq: not evicted: \(names.count) file\(names.count == 1 ? "" : "s") in \(root.display): \(reason): \(shown)")
            }
        }
        print("evicted \(evicted) files" + (refused > 0 ? ", \(refused) refused" : ""))
        if refused > 0 { throw ExitCode.failure }
    }
}

struct Pin: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Keep files or folders downloaded: fetched now, never evicted.",
        discussion: prose("""
            Pinning a folder covers everything under it, including what is added later.

            Examples:
              ubiq pin ~/Ubiquity/Documents
            """))

    @Argument(help: "Files or folders in a ubiq mount.", completion: .file())
    var paths: [String]

    func run() throws { try setPinned(paths, true) }
}

struct Unpin: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Stop keeping files or folders downloaded (they stay until evicted).",
        discussion: "Example: ubiq unpin ~/Ubiquity/Documents")

    @Argument(help: "Files or folders in a ubiq mount.", completion: .file())
    var paths: [String]

    func run() throws { try setPinned(paths, false) }
}

func setPinned(_ paths: [String], _ on: Bool) throws {
    var failed = 0
    for item in BytePath.inMounts(paths) {
        let p = item.display
        let e = item.setAttribute("user.ubiq.pinned", on ? "1" : "0")
        if e != 0 {
            FileHandle.standardError.write(Data("ubiq: cannot \(on ? "pin" : "unpin") \(p): \(String(cString: strerror(e)))\n".utf8))
            failed += 1
        } else {
            print("\(on ? "pinned" : "unpinned") \(p)")
        }
    }
    if failed > 0 { throw ExitCode.failure }
}
