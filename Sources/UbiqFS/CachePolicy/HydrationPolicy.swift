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
    /// Finds a process's name; replaceable for tests.
    public var processName: @Sendable (Int32) -> String?

    public static let defaultBlocked: Set<String> = [
        "tumblerd", "gnome-thumbnail-factory", "gdk-pixbuf-thumbnailer", "totem-video-thumbnailer",
        "evince-thumbnailer", "ffmpegthumbnailer", "gsf-office-thumbnailer", "tracker-miner-fs",
        "tracker-miner-fs-3", "tracker-extract", "tracker-extract-3", "baloo_file", "baloo_file_extractor",
        "kioworker", "kio_thumbnail",
    ]

    public init(blocked: Set<String> = HydrationPolicy.defaultBlocked,
                processName: @escaping @Sendable (Int32) -> String? = HydrationPolicy.procName) {
        self.blocked = Set(blocked.map { String($0.utf8.prefix(15)) ?? $0 })
        self.processName = processName
    }

    /// Everyone may download.
    public static let off = HydrationPolicy(blocked: [])

    public func mayDownload(pid: Int32) -> Bool {
        if blocked.isEmpty || pid <= 0 { return true }
        guard let name = processName(pid) else { return true }
        return !blocked.contains(String(name.utf8.prefix(15)) ?? name)
    }

    @Sendable public static func procName(_ pid: Int32) -> String? {
        guard let s = try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8) else { return nil }
        return s.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
