import Foundation
import Testing

/// GNOME Files with Ubiquity's extension (desktop/nautilus), for real: items of a mount in each
/// state, the extension's own functions with Nautilus's Python bindings, Nautilus itself under
/// Xvfb labelling every item (a screenshot, kept, and each emblem looked for in it), and a status
/// change behind its back shown again from `ubiq watch` (tools/nautilus_check.py says how).
@Suite(.serialized) struct DesktopTests {
    static let tool = packageRoot.appendingPathComponent("Tests/MountTests/tools/nautilus_check.py").path
    /// Where the screenshot is kept: $UBIQ_ARTIFACTS, or .build/artifacts.
    static let artifacts = ProcessInfo.processInfo.environment["UBIQ_ARTIFACTS"]
        ?? packageRoot.appendingPathComponent(".build/artifacts").path

    @Test func gnomeFilesShowsEachStatusAndActsOnIt() throws {
        // scripts/setup installs them with UBIQ_SETUP_TESTS=1 (scripts/test does).
        let missing = ["/usr/bin/nautilus", "/usr/bin/Xvfb", "/usr/bin/dbus-run-session", "/usr/bin/gsettings"]
            .filter { !FileManager.default.isExecutableFile(atPath: $0) }
        try #require(missing.isEmpty, "not installed: \(missing) (UBIQ_SETUP_TESTS=1 scripts/setup installs them)")
        // A slow link keeps a big file downloading; a quota keeps a file over it uploading.
        let m = try MountFixture(extra: "--quota 32M", daemonEnv: ["UBIQ_STORE_READ_RATE": "131072"])
        defer { m.cleanup() }
        let shot = Self.artifacts + "/nautilus.png"
        let run = shell("/usr/bin/python3 \(Self.tool) --mount \(m.mnt) --store \(m.store) "
                        + "--desktop \(packageRoot.appendingPathComponent("desktop").path) --ubiq \(ubiqBinary) --out \(shot)",
                        env: m.env, timeout: 900)
        #expect(run.status == 0, "\(run.out)\(run.err.suffix(3000))")
        #expect(FileManager.default.fileExists(atPath: shot), "no screenshot at \(shot)")
    }
}
