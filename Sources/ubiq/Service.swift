import ArgumentParser
import Foundation

struct Service: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount at login with a systemd user unit.",
        discussion: prose("""
            Examples:
              ubiq service install ~/Ubiquity
              ubiq service uninstall ~/Ubiquity
            """),
        subcommands: [ServiceInstall.self, ServiceUninstall.self])
}

/// Where systemd looks for a user's own units.
func userUnitDirectory() -> String {
    Paths.configHome + "/systemd/user"
}

func unitName(for mountpoint: String) -> String { "ubiq-" + Paths.mountID(mountpoint) + ".service" }

/// One ExecStart= word, quoted as systemd reads it.
func systemdWord(_ s: String) -> String {
    var out = "\""
    for c in s {
        switch c {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "%": out += "%%"
        case "$": out += "$$"
        default: out.append(c)
        }
    }
    return out + "\""
}

/// Runs `systemctl --user ARGS`; returns (status, what it printed).
func systemctlUser(_ args: [String]) -> (Int32, String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    p.arguments = ["systemctl", "--user"] + args
    let pipe = Pipe()
    p.standardOutput = pipe
    p.standardError = pipe
    do { try p.run() } catch { return (127, "\(error)") }
    let out = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    p.waitUntilExit()
    return (p.terminationStatus, out.trimmingCharacters(in: .whitespacesAndNewlines))
}

struct ServiceInstall: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "install",
        abstract: "Write a systemd user unit that mounts MOUNTPOINT at login, and start it.",
        discussion: prose("""
            Options after -- are `ubiq mount` options. The unit runs `ubiq mount --foreground`, restarts it
            if it fails, and stops with `ubiq unmount` (pending uploads go out first). Units live in
            $XDG_CONFIG_HOME/systemd/user (default ~/.config/systemd/user), named ubiq-<mount id>.service.

            Examples:
              ubiq service install ~/Ubiquity
              ubiq service install ~/Work -- --store dir:/srv/work-store --cache-size 20G
              ubiq service install --no-start ~/Ubiquity
            """))

    @Flag(help: "Only write the unit; do not enable or start it.")
    var noStart = false

    @Argument(help: "Where to mount.", completion: .directory)
    var mountpoint: String

    @Argument(parsing: .postTerminator, help: "`ubiq mount` options.")
    var mountArguments: [String] = []

    func run() throws {
        let mp = Paths.absolute(mountpoint)
        // The options must make a valid `ubiq mount` now, not fail at every login.
        let m: Mount
        do { m = try Mount.parse(mountArguments + [mp]) } catch {
            fail("invalid mount options: \(Mount.message(for: error))")
        }
        for (flag, value) in [("--cache-size", m.cacheSize), ("--quota", m.quota)] {
            if let value, MountPlan.parseSize(value) == nil { fail("invalid \(flag) \(value): use a size like 500M or 20G") }
        }
        if mountArguments.contains("--foreground") { fail("--foreground is the unit's own; leave it out") }
        try? FileManager.default.createDirectory(atPath: mp, withIntermediateDirectories: true)
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        let start = ([exe, "mount", "--foreground"] + mountArguments + [mp]).map(systemdWord).joined(separator: " ")
        let stop = [exe, "unmount", mp].map(systemdWord).joined(separator: " ")
        // No network-online.target: a user manager has none (it is the system manager's), so it
        // would order nothing. A store not reachable yet at login fails the mount, which
        // Restart= tries again every 5 s.
        let unit = """
            [Unit]
            Description=Ubiquity mount at \(mp)

            [Service]
            Type=simple
            ExecStart=\(start)
            ExecStop=\(stop)
            Restart=on-failure
            RestartSec=5
            TimeoutStopSec=120

            [Install]
            WantedBy=default.target

            """
        let dir = userUnitDirectory()
        let name = unitName(for: mp)
        do {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try unit.write(toFile: dir + "/" + name, atomically: true, encoding: .utf8)
        } catch { fail("cannot write \(dir)/\(name): \(error.localizedDescription)") }
        print("wrote \(dir)/\(name)")
        if noStart {
            print("start it with: systemctl --user daemon-reload && systemctl --user enable --now \(name)")
            return
        }
        for args in [["daemon-reload"], ["enable", "--now", name]] {
            let (status, out) = systemctlUser(args)
            if status != 0 {
                fail("systemctl --user \(args.joined(separator: " ")) failed (\(out)); the unit is written: "
                     + "start it with systemctl --user enable --now \(name)")
            }
        }
        print("enabled and started \(name): \(mp) mounts at every login")
    }
}

struct ServiceUninstall: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "uninstall",
        abstract: "Stop and remove the systemd user unit of MOUNTPOINT.",
        discussion: "Example: ubiq service uninstall ~/Ubiquity")

    @Argument(help: "The mount point the unit mounts.", completion: .directory)
    var mountpoint: String

    func run() throws {
        let mp = Paths.absolute(mountpoint)
        let name = unitName(for: mp)
        let path = userUnitDirectory() + "/" + name
        guard FileManager.default.fileExists(atPath: path) else { fail("no unit for \(mp) (looked for \(path))") }
        _ = systemctlUser(["disable", "--now", name])  // may fail without a user session: the file goes anyway
        do { try FileManager.default.removeItem(atPath: path) } catch { fail("cannot remove \(path): \(error.localizedDescription)") }
        _ = systemctlUser(["daemon-reload"])
        print("removed \(path)")
    }
}
