import Foundation
import Logging
import UbiqClock
import UbiqFS

/// Desktop notifications of conflicts, as iCloud Drive and OneDrive show them: when two devices
/// changed one file and both versions were kept, the user's desktop says so, with both names
/// (org.freedesktop.Notifications, through `gdbus` from libglib2.0-bin; docs/desktop.md).
/// Started only where the daemon has a desktop session's bus; `UBIQ_NOTIFY=0` turns it off.
final class ConflictNotifier: @unchecked Sendable {
    private let mount: String
    private let gdbus: String
    private let logger: Logger
    /// Conflicts that come within this long of each other are said in one notification.
    static let gather: TimeInterval = 1

    private init(mount: String, gdbus: String, logger: Logger) {
        self.mount = mount; self.gdbus = gdbus; self.logger = logger
    }

    /// Starts announcing `events`' conflicts on the session bus of the environment; nil when
    /// there is none (a mount by root from fstab, a server) or no `gdbus`.
    static func start(events: EventBus, mount: String, logger: Logger,
                      environment: [String: String] = ProcessInfo.processInfo.environment) -> ConflictNotifier? {
        if environment["UBIQ_NOTIFY"] == "0" { return nil }
        let bus = environment["DBUS_SESSION_BUS_ADDRESS"].map { !$0.isEmpty }
            ?? environment["XDG_RUNTIME_DIR"].map { FileManager.default.fileExists(atPath: $0 + "/bus") } ?? false
        guard bus else { return nil }
        let path = (environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":").map { String($0) + "/gdbus" }
        guard let gdbus = path.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            logger.info("no gdbus (libglib2.0-bin): conflicts are not shown as desktop notifications")
            return nil
        }
        let n = ConflictNotifier(mount: mount, gdbus: gdbus, logger: logger)
        // Conflicts only: the events nobody hears are not made (`EventBus.wants`).
        let sub = events.subscribe(limit: 1000, kinds: [.conflict])
        let t = Thread { n.run(sub) }
        t.name = "ubiq-notify"
        t.start()
        return n
    }

    private func run(_ sub: EventBus.Subscription) {
        var pending: [(item: String, copy: String?)] = []
        var since = Deadline(in: 0)
        while let (events, _) = sub.next(timeout: pending.isEmpty ? 60 : max(0.05, since.remaining)) {
            for e in events {
                if pending.isEmpty { since = Deadline(in: Self.gather) }
                pending.append((e.path, e.copyBytes.map { String(decoding: $0, as: UTF8.self) }))
            }
            if !pending.isEmpty && since.passed {
                notify(pending)
                pending.removeAll()
            }
        }
    }

    /// One notification for `conflicts` (paths below the mount).
    private func notify(_ conflicts: [(item: String, copy: String?)]) {
        func name(_ p: String) -> String { (p as NSString).lastPathComponent }
        let summary: String
        let body: String
        if conflicts.count == 1, let c = conflicts.first {
            summary = "Conflict: \(name(c.item))"
            body = c.copy.map { "Two devices changed it; both versions are kept: \(name(c.item)) and \(name($0)), in \(mount)/\((c.item as NSString).deletingLastPathComponent)" }
                ?? "It changed here and on another device; this device's version is kept, in \(mount)/\(c.item)"
        } else {
            summary = "\(conflicts.count) conflicts in \(name(mount))"
            let names = conflicts.prefix(5).map { name($0.item) }.joined(separator: ", ")
            body = "Two devices changed them; both versions are kept beside each: \(names)" + (conflicts.count > 5 ? " and \(conflicts.count - 5) more" : "")
        }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: gdbus)
        p.arguments = ["call", "--session", "--timeout", "5", "--dest", "org.freedesktop.Notifications",
                       "--object-path", "/org/freedesktop/Notifications", "--method", "org.freedesktop.Notifications.Notify",
                       Self.gvariant("Ubiquity"), "uint32 0", Self.gvariant("dialog-warning"), Self.gvariant(summary),
                       Self.gvariant(body), "@as []", "@a{sv} {}", "int32 -1"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        do {
            try p.run()
            p.waitUntilExit()
            if p.terminationStatus != 0 { logger.info("a conflict notification was not shown (gdbus exited \(p.terminationStatus))") }
        } catch {
            logger.info("a conflict notification was not shown: \(error)")
        }
    }

    /// `s` as a GVariant string literal (what `gdbus call` parses each argument as).
    static func gvariant(_ s: String) -> String {
        "\"" + s.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
    }
}
