import Foundation

/// Which programs may not trigger downloads. File managers' thumbnailers and
/// desktop indexers open every file they see; on a cloud mount that would
/// download everything. Listed programs are served only bytes that are
/// already local; opening a placeholder that is not gives them EACCES, which
/// they take as "no preview". (Windows' Cloud Files API blocks hydration per
/// process the same way.)
public struct HydrationPolicy: Sendable {
    /// Process names (as in /proc/PID/comm, compared on their first 15 bytes).
    public var blocked: Set<String>
    /// The names a caller goes by, nearest first (`callerNames`); replaceable for tests.
    public var names: @Sendable (Int32) -> [String]

    public static let defaultBlocked: Set<String> = [
        "tumblerd", "gnome-thumbnail-factory", "gdk-pixbuf-thumbnailer", "totem-video-thumbnailer",
        "evince-thumbnailer", "ffmpegthumbnailer", "gsf-office-thumbnailer", "tracker-miner-fs",
        "tracker-miner-fs-3", "tracker-extract", "tracker-extract-3", "baloo_file", "baloo_file_extractor",
        "kioworker", "kio_thumbnail",
    ]

    public init(blocked: Set<String> = HydrationPolicy.defaultBlocked,
                names: @escaping @Sendable (Int32) -> [String] = HydrationPolicy.callerNames) {
        self.blocked = Set(blocked.map { String($0.utf8.prefix(15)) ?? $0 })
        self.names = names
    }

    /// Everyone may download.
    public static let off = HydrationPolicy(blocked: [])

    /// Whether the thread `pid` (FUSE names the calling thread) may download: not when it, its
    /// process or one of the processes that started it is listed.
    public func mayDownload(pid: Int32) -> Bool {
        if blocked.isEmpty || pid <= 0 { return true }
        return !names(pid).contains { blocked.contains(String($0.utf8.prefix(15)) ?? $0) }
    }

    /// How many parents of a caller's process count: a thumbnailer's helper (tumblerd runs
    /// one for a kind of file it has no plugin for), not the session that started it all.
    static let parentsLooked = 3

    /// The names the thread `tid` goes by: its own (a worker thread names itself: tumblerd's
    /// `pool-tumblerd`), its process's, and up to `parentsLooked` parents', nearest first.
    /// Only a name that was read counts: a process that went leaves a shorter list.
    @Sendable public static func callerNames(_ tid: Int32) -> [String] {
        guard let thread = comm(tid) else { return [] }
        var names = [thread]
        guard let (tgid, ppid) = ids(tid) else { return names }
        if tgid != tid, let process = comm(tgid) { names.append(process) }
        var parent = ppid
        for _ in 0 ..< parentsLooked where parent > 1 {
            guard let name = comm(parent), let (_, next) = ids(parent) else { break }
            names.append(name)
            parent = next
        }
        return names
    }

    private static func comm(_ pid: Int32) -> String? {
        guard let s = try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8) else { return nil }
        return s.trimmingCharacters(in: .newlines)
    }

    /// A thread's process (Tgid) and that process's parent (PPid), from /proc/TID/status.
    private static func ids(_ pid: Int32) -> (tgid: Int32, ppid: Int32)? {
        guard let s = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        var tgid: Int32?, ppid: Int32?
        for line in s.split(separator: "\n") {
            if line.hasPrefix("Tgid:") { tgid = Int32(line.dropFirst(5).trimmingCharacters(in: .whitespaces)) }
            if line.hasPrefix("PPid:") { ppid = Int32(line.dropFirst(5).trimmingCharacters(in: .whitespaces)) }
            if tgid != nil && ppid != nil { break }
        }
        guard let tgid, let ppid else { return nil }
        return (tgid, ppid)
    }
}
