import ArgumentParser
import Foundation
import UbiqControl
import UbiqState
import UbiqStore

struct Query: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Find items by name, place, status, size or time, from the mount's database (no walk of the tree).",
        discussion: prose("""
            Answers from the daemon's state database, like NSMetadataQuery: fast on large trees, and
            never downloading. Prints "status size modified path" lines, or with --json one JSON array
            (docs/status.md). --watch prints the results as JSON lines ("added"), then a "gathered"
            line, then "added", "changed" and "removed" lines as the results change, at most once per
            --interval, until interrupted.

            Examples:
              ubiq query --name '*.pdf' ~/Ubiquity
              ubiq query --status placeholder --min-size 100M --sort size --reverse ~/Ubiquity
              ubiq query --newer-than 2h --type file --json ~/Ubiquity/Projects
              ubiq query --status uploading,error --watch ~/Ubiquity
            """))

    @Option(help: ArgumentHelp("Shell glob on the name (case-sensitive).", valueName: "GLOB"))
    var name: String?

    @Option(help: ArgumentHelp("Status words, comma-separated: \(SyncStatus.allCases.map(\.rawValue).joined(separator: ", ")).", valueName: "S,..."), completion: .list(SyncStatus.allCases.map(\.rawValue)))
    var status: String?

    @Option(help: ArgumentHelp("file, folder, symlink or other.", valueName: "TYPE"), completion: .list(["file", "folder", "symlink", "other"]))
    var type: String?

    @Option(help: ArgumentHelp("At least this size, e.g. 10M.", valueName: "SIZE"))
    var minSize: String?

    @Option(help: ArgumentHelp("At most this size.", valueName: "SIZE"))
    var maxSize: String?

    @Option(help: ArgumentHelp("Modified within this long (30m, 2h, 7d) or after this date (2026-11-01).", valueName: "WHEN"))
    var newerThan: String?

    @Option(help: ArgumentHelp("Modified before this long ago, or before this date.", valueName: "WHEN"))
    var olderThan: String?

    @Option(help: "Depth below PATH at least (1: its direct children).")
    var minDepth: Int?

    @Option(help: "Depth below PATH at most.")
    var maxDepth: Int?

    @Option(help: ArgumentHelp("path, name, size or time.", valueName: "KEY"), completion: .list(["path", "name", "size", "time"]))
    var sort: String = "path"

    @Flag(help: "Sort in descending order.")
    var reverse = false

    @Option(help: "At most this many results.")
    var limit: Int?

    @Flag(help: "One JSON array (with --watch: JSON lines).")
    var json = false

    @Flag(help: "Keep running and print changes to the results as JSON lines.")
    var watch = false

    @Option(help: "With --watch: seconds to gather changes before reporting them.")
    var interval: Double = 1

    @Argument(help: "A folder in a ubiq mount: the scope of the query.", completion: .directory)
    var path: String

    func validate() throws {
        guard StateTransaction.sortKeys.contains(sort) else { throw ValidationError("--sort must be one of path, name, size, time") }
        if let type, !["file", "folder", "symlink", "other"].contains(type) {
            throw ValidationError("--type must be one of file, folder, symlink, other")
        }
        for s in statusList where SyncStatus(rawValue: s) == nil {
            throw ValidationError("unknown status \(s); one of \(SyncStatus.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        if let m = minDepth, m < 0 { throw ValidationError("--min-depth must not be negative") }
        if let m = maxDepth, m < 1 { throw ValidationError("--max-depth must be at least 1") }
        if let l = limit, l < 0 { throw ValidationError("--limit must not be negative") }
        if let refused = secondsRefused(interval, "--interval") { throw ValidationError(refused) }
        _ = try spec()  // sizes and times: refused here, with this command's usage
    }

    var statusList: [String] { status.map { $0.split(separator: ",").map { String($0).trimmingCharacters(in: .whitespaces) } } ?? [] }

    func spec() throws -> QuerySpec {
        var q = QuerySpec()
        q.name = name
        q.status = status == nil ? nil : statusList.compactMap(SyncStatus.init(rawValue:))
        q.type = type
        q.minDepth = minDepth
        q.maxDepth = maxDepth
        q.sort = sort
        q.descending = reverse
        q.limit = limit
        func size(_ s: String, _ flag: String) throws -> Int64 {
            guard let v = MountPlan.parseSize(s) else { throw ValidationError("invalid \(flag) \(s): use a size like 500K, 10M or 2G") }
            return v
        }
        if let s = minSize { q.minSize = try size(s, "--min-size") }
        if let s = maxSize { q.maxSize = try size(s, "--max-size") }
        if let w = newerThan { q.modifiedAfter = try Self.when(w) }
        if let w = olderThan { q.modifiedBefore = try Self.when(w) }
        return q
    }

    /// "30m", "2h", "7d", "45s" ago, or a date ("2026-11-01", "2026-11-01T10:00:00Z"): ns since the epoch.
    static func when(_ s: String) throws -> Int64 {
        if let ago = lengthOfTime(s) { return nanoseconds(sinceEpoch: Date().timeIntervalSince1970 - ago) }
        let iso = ISO8601DateFormatter()
        if let d = iso.date(from: s) { return nanoseconds(sinceEpoch: d.timeIntervalSince1970) }
        iso.formatOptions = [.withFullDate]
        if let d = iso.date(from: s) { return nanoseconds(sinceEpoch: d.timeIntervalSince1970) }
        throw ValidationError("cannot read \(s) as a time: use 30m, 2h, 7d, or a date like 2026-11-01")
    }

    func run() throws {
        let q = try spec()
        let client = ControlClient.connect(for: path)
        defer { client.close() }
        let abs = Paths.absolute(path)
        var isDir: ObjCBool = false
        guard FileManager.default.fileExists(atPath: abs, isDirectory: &isDir), isDir.boolValue else { fail("\(path) is not a folder") }
        let scope = client.relative(abs)
        func fetch(_ c: ControlClient, _ each: (QueryRow) throws -> Void) {
            do { try c.connection.query(scope: scope, spec: q, each: each) } catch {
                fail(error is ControlError ? "\(error)" : "the daemon of \(c.mount): \(error)")
            }
        }
        if !watch {
            // Each row printed as it comes (written out 64 KiB at a time).
            var out: [UInt8] = []
            var rows = 0
            func put(_ s: String) {
                out.append(contentsOf: s.utf8)
                if out.count >= 1 << 16 { writeOut(&out) }
            }
            if json { put("[") }
            fetch(client) { r in
                if json {
                    put((rows == 0 ? "\n  " : ",\n  ") + itemJSON(r, abs, change: nil))
                } else {
                    let size = r.type == "file" ? humanBytes(r.size) : "-"
                    put(pad(r.status.rawValue, 11) + " " + pad(size, 9) + " " + timeText(r.mtimeNs, minutes: true) + "  "
                        + join(abs, r.rawPath.map { BytePath(bytes: $0).display } ?? r.path) + "\n")  // \xNN for bytes not UTF-8
                }
                rows += 1
            }
            if json { put(rows == 0 ? "]\n" : "\n]\n") }
            writeOut(&out)
            return
        }
        var rows: [QueryRow] = []
        fetch(client) { rows.append($0) }
        // --watch: the results, then their changes, gathered over --interval.
        var current = Dictionary(rows.map { ($0.path, $0) }, uniquingKeysWith: { a, _ in a })
        for r in rows { emit("added", r, abs) }
        say(jsonLine(["change": "gathered", "count": rows.count]))
        let events = ControlClient.connect(for: path)
        _ = events.request(.watch(scope: scope), as: Done.self)
        let queries = ControlClient.connect(for: path)
        while events.next(WatchEvent.self) != nil {
            // Something changed: wait out the interval (more may come), then compare.
            Thread.sleep(forTimeInterval: interval)
            var now: [QueryRow] = []
            fetch(queries) { now.append($0) }
            let fresh = Dictionary(now.map { ($0.path, $0) }, uniquingKeysWith: { a, _ in a })
            for (p, r) in fresh.sorted(by: { $0.key < $1.key }) {
                if let old = current[p] {
                    if old != r { emit("changed", r, abs) }
                } else {
                    emit("added", r, abs)
                }
            }
            for (p, r) in current.sorted(by: { $0.key < $1.key }) where fresh[p] == nil { emit("removed", r, abs) }
            current = fresh
        }
        fail("the daemon of \(client.mount) went away")
    }

    private func join(_ base: String, _ rel: String) -> String { rel.isEmpty ? base : base + "/" + rel }

    /// Writes `out` to standard output and empties it; a reader gone (`| head`) ends the command.
    private func writeOut(_ out: inout [UInt8]) {
        var done = 0
        while done < out.count {
            let n = out.withUnsafeBytes { Glibc.write(1, $0.baseAddress! + done, $0.count - done) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { Glibc.exit(errno == EPIPE ? 0 : 1) }
            done += n
        }
        out.removeAll(keepingCapacity: true)
    }

    private func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }

    /// One item as a JSON object (written by hand: 100,000 of them must take well under a second).
    private func itemJSON(_ r: QueryRow, _ base: String, change: String?) -> String {
        var o = "{"
        if let change { o += "\"change\":\"\(change)\"," }
        o += "\"depth\":\(r.depth),\"modified\":\"\(timeText(r.mtimeNs, minutes: false))\",\"name\":" + jsonString(r.name)
        o += ",\"path\":" + jsonString(join(base, r.path)) + ",\"pinned\":\(r.pinned),\"size\":\(r.size)"
        o += ",\"status\":\"\(r.status.rawValue)\",\"type\":\"\(r.type)\"}"
        return o
    }

    private func emit(_ change: String, _ r: QueryRow, _ base: String) { say(itemJSON(r, base, change: change)) }
}

/// UTC time of `ns` since the epoch: "2026-11-23T12:02:37.200Z", or "2026-11-23 12:02" (local).
func timeText(_ ns: Int64, minutes: Bool) -> String {
    var t = time_t(ns / 1_000_000_000)
    var tm = tm()
    if minutes { localtime_r(&t, &tm) } else { gmtime_r(&t, &tm) }
    func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
    let date = "\(tm.tm_year + 1900)-\(two(tm.tm_mon + 1))-\(two(tm.tm_mday))"
    if minutes { return date + " " + two(tm.tm_hour) + ":" + two(tm.tm_min) }
    let ms = Int((ns % 1_000_000_000 + 1_000_000_000) % 1_000_000_000 / 1_000_000)
    let msText = ms < 10 ? "00\(ms)" : (ms < 100 ? "0\(ms)" : "\(ms)")
    return date + "T" + two(tm.tm_hour) + ":" + two(tm.tm_min) + ":" + two(tm.tm_sec) + "." + msText + "Z"
}

struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print what happens under a folder, as JSON lines, until interrupted.",
        discussion: prose("""
            Events: changed (here), changed-remotely (by another device), status (uploaded,
            downloaded, failed), conflict (with "copy", the conflict copy kept beside it, when
            there is one), deleted, moved (with "from"). Each line:
              {"event":"changed","path":"/home/me/Ubiquity/a.txt",
               "time":"2026-11-23T12:00:00.000Z"}
            A path whose bytes are not UTF-8 has them in "rawPath" (and "rawFrom"), as numbers.

            Example:
              ubiq watch ~/Ubiquity/Projects
            """))

    @Argument(help: "A folder (or file) in a ubiq mount.", completion: .file())
    var path: String

    func run() throws {
        let client = ControlClient.connect(for: path)
        defer { client.close() }
        let abs = Paths.absolute(path)
        _ = client.request(.watch(scope: client.relative(abs)), as: Done.self)
        let base = client.mount
        let prefix = Array(base.utf8) + [UInt8(ascii: "/")]
        while var e = client.next(WatchEvent.self) {
            e.path = e.path.map { $0.isEmpty ? base : base + "/" + $0 }
            e.from = e.from.map { $0.isEmpty ? base : base + "/" + $0 }
            e.copy = e.copy.map { base + "/" + $0 }
            e.rawCopy = e.rawCopy.map { prefix + $0 }
            e.rawPath = e.rawPath.map { prefix + $0 }
            e.rawFrom = e.rawFrom.map { prefix + $0 }
            say(jsonLine(e))
        }
        fail("the daemon of \(client.mount) went away")
    }
}
