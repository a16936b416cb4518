import Foundation
import Testing
import TestSupport

/// `scripts/package` builds a Debian package that installs on this machine with `dpkg -i`: a
/// binary that needs no Swift on the machine, manual pages, completions, `ubiq` on the system
/// PATH for mount(8); and `dpkg -r` takes every file of it away again.
@Suite(.serialized) struct PackageTests {
    @Test func theDebianPackageInstallsMountsAndGoesAway() throws {
        guard shell("dpkg -s ubiq").status != 0 else {
            Issue.record("a ubiq package is installed on this machine already: not touching it")
            return
        }
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-pkg-\(UUID().uuidString.prefix(8))").path
        defer {
            shell("umount '\(base)/mnt' 2>/dev/null || fusermount3 -u -z '\(base)/mnt' 2>/dev/null; dpkg -r ubiq >/dev/null 2>&1; rm -rf '\(base)'")
        }
        // Built by scripts/test beforehand: `swift test` holds the build directory.
        let built = shell("scripts/package \(base)/out", cwd: packageRoot.path, env: ["UBIQ_PACKAGE_BUILT": "1"], timeout: 600)
        expectOK(built, "scripts/package: \(built.err.suffix(2000))")
        let deb = built.out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(deb.hasSuffix(".deb") && deb.contains("/ubiq_0.1.0_"), "\(deb)")
        let info = shell("dpkg-deb --field \(deb) Depends").out
        #expect(info.contains("fuse3") && info.contains("libfuse3-3") && info.contains("libssl3"), "Depends: \(info)")
        let files = shell("dpkg-deb --contents \(deb) | awk '{print $6}' | sed 's|^\\./|/|' | grep -v '/$'").out
            .split(separator: "\n").map(String.init)
        // A ubiq in /usr/local/bin (scripts/run links a build there) would shadow the package's:
        // the install says so (one made for the test when there is none, and taken away after).
        let madeLink = !FileManager.default.fileExists(atPath: "/usr/local/bin/ubiq")
            && shell("ln -s \(ubiqBinary) /usr/local/bin/ubiq").status == 0
        defer { if madeLink { unlink("/usr/local/bin/ubiq") } }
        let installed = shell("dpkg -i \(deb)")
        expectOK(installed, "dpkg -i")
        #expect(FileManager.default.fileExists(atPath: "/usr/local/bin/ubiq"), "no /usr/local/bin/ubiq: the mount below proves nothing of a shadowing one")
        if FileManager.default.fileExists(atPath: "/usr/local/bin/ubiq") {
            #expect(installed.err.contains("/usr/local/bin/ubiq comes before /usr/bin/ubiq on PATH"), "\(installed.out)\(installed.err)")
        }

        // What a user checks first.
        #expect(shell("/usr/bin/ubiq --version").out == "0.1.0\n")
        #expect(shell("ldd /usr/bin/ubiq | grep -ci swift").out == "0\n", "needs the Swift runtime: \(shell("ldd /usr/bin/ubiq").out)")
        #expect(shell("MANWIDTH=80 man ubiq 2>/dev/null").out.contains("Mount a cloud store as a folder"))
        #expect(shell("MANWIDTH=80 man ubiq.mount 2>/dev/null").out.contains("--cache-size"))
        let completion = shell("bash -c 'source /usr/share/bash-completion/completions/ubiq && complete -p ubiq'")
        #expect(completion.out.contains("ubiq"), "\(completion.out)\(completion.err)")
        #expect(files.contains("/usr/share/zsh/vendor-completions/_ubiq") && files.contains("/usr/share/fish/vendor_completions.d/ubiq.fish"))
        // GNOME Files' extension, where nautilus-python loads extensions from, and its emblems.
        #expect(files.contains("/usr/share/nautilus-python/extensions/ubiq_nautilus.py"), "\(files)")
        #expect(files.filter { $0.hasPrefix("/usr/share/icons/hicolor/scalable/emblems/emblem-ubiq-") }.count == 8)
        #expect(shell("dpkg-deb --field \(deb) Suggests").out.contains("python3-nautilus"))

        // mount(8) runs the package's binary, though a developer's link in /usr/local/bin comes first on PATH.
        try FileManager.default.createDirectory(atPath: base + "/mnt", withIntermediateDirectories: true)
        let path = ["PATH": "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        expectOK(shell("mount -t fuse.ubiq dir:\(base)/store \(base)/mnt -o state=\(base)/state,create_store", env: path), "mount -t fuse.ubiq")
        // The package's own binary serves it, whatever ubiq comes first on PATH (its helper
        // /usr/sbin/mount.fuse.ubiq, which mount(8) runs rather than mount.fuse3).
        #expect(files.contains("/usr/sbin/mount.fuse.ubiq"), "\(files)")
        let served = shell("pgrep -af 'state \(base)/state'").out
        #expect(served.contains("/usr/bin/ubiq") || served.contains("mount.fuse.ubiq"), "the packaged binary serves the mount: \(served)")
        expectOK(shell("echo packaged > \(base)/mnt/f && cat \(base)/mnt/f"))
        expectOK(shell("umount \(base)/mnt"), "umount")
        waitUntil(seconds: 30, every: 0.1) { shell("pgrep -f 'state \(base)/state'").status != 0 }

        expectOK(shell("dpkg -r ubiq"), "dpkg -r")
        let left = files.filter { FileManager.default.fileExists(atPath: $0) }
        #expect(left.isEmpty, "left after dpkg -r: \(left)")
        #expect(files.count > 30, "\(files)")
    }
}
