import Foundation
import Testing
import TestSupport

/// The mount compared with a local ext4 directory: random POSIX operations step by step
/// (tools/fsrandom.py; the seed is printed, UBIQ_SEED replays), timestamps, permissions.
@Suite(.serialized) struct LocalDiskComparisonTests {
    static let tool = packageRoot.appendingPathComponent("Tests/MountTests/tools/fsrandom.py").path

    @Test func mountBehavesLikeALocalDiskThenSurvivesRemountAndSync() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let local = m.base + "/local"
        try FileManager.default.createDirectory(atPath: local, withIntermediateDirectories: true)
        let seed = ProcessInfo.processInfo.environment["UBIQ_SEED"].flatMap(Int.init) ?? Int.random(in: 1 ... 1_000_000)
        print("fsrandom seed \(seed) (replay: UBIQ_SEED=\(seed))")
        let run = shell("python3 \(Self.tool) \(m.mnt) \(local) --seed \(seed) --ops 1500")
        #expect(run.status == 0, "seed \(seed): \(run.out)\(run.err)")
        // What the local disk has, the mount still has after a remount...
        expectOK(m.unmount())
        try m.mount()
        let again = shell("python3 \(Self.tool) \(m.mnt) \(local) --compare-only")
        #expect(again.status == 0, "after remount, seed \(seed): \(again.out)\(again.err)")
        // ...and another device has it too, once uploaded (hard links arrive as separate files).
        let b = try MountFixture(store: m.store, name: "device-b")
        defer { b.cleanup() }
        let other = shell("python3 \(Self.tool) \(b.mnt) \(local) --compare-only --ignore-nlink")
        #expect(other.status == 0, "second device, seed \(seed): \(other.out)\(other.err)")
    }

    /// mtime/ctime/atime of a file and its folders change after each operation exactly as on ext4.
    /// The exerciser shrinks what it finds: with a fault put into one of two plain folders (its
    /// chmod drops a bit), a long failing run comes down to a few operations, printed as lines
    /// that replay it; replayed on two faithful folders, the same lines agree.
    @Test func theExerciserShrinksAFailingSequence() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-shrink-\(UUID().uuidString.prefix(8))").path
        defer { try? FileManager.default.removeItem(atPath: base) }
        try FileManager.default.createDirectory(atPath: base + "/a", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: base + "/b", withIntermediateDirectories: true)
        let run = shell("python3 \(Self.tool) a b --seed 3 --ops 400 --break-first-root", cwd: base)
        #expect(run.status == 1, "\(run.out)\(run.err)")
        let lines = run.out.split(separator: "\n").map(String.init)
        guard let at = lines.firstIndex(where: { $0.hasPrefix("shrunk to ") }) else {
            Issue.record("not shrunk: \(run.out)")
            return
        }
        let found = lines.first { $0.hasPrefix("seed 3 step ") } ?? ""
        let step = Int(found.split(separator: " ")[3].dropLast()) ?? 0
        let ops = lines[(at + 1)...].prefix { $0.hasPrefix("{") }
        #expect(ops.count >= 1 && ops.count <= 3 && ops.count < step, "\(step) steps shrunk to \(ops.count): \(run.out)")
        try (ops.joined(separator: "\n") + "\n").write(toFile: base + "/ops.jsonl", atomically: true, encoding: .utf8)
        #expect(shell("python3 \(Self.tool) a b --replay ops.jsonl --break-first-root", cwd: base).status == 1)
        #expect(shell("python3 \(Self.tool) a b --replay ops.jsonl", cwd: base).status == 0)
    }

    @Test func timestampsChangeAsOnALocalDisk() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let local = m.base + "/local"
        try FileManager.default.createDirectory(atPath: local, withIntermediateDirectories: true)
        let tool = packageRoot.appendingPathComponent("Tests/MountTests/tools/timestamps.py").path
        let r = shell("python3 \(tool) \(m.mnt) \(local)")
        #expect(r.status == 0, "\(r.out)\(r.err)")
    }

    /// Owners, modes, sticky and setgid folders, setuid clearing: as on ext4, for other users
    /// too (mounted with allow_other; needs root, as the suite does).
    @Test func permissionsFollowTheLocalDiskRules() throws {
        let m = try MountFixture(extra: "-o allow_other")
        defer { m.cleanup() }
        let local = m.base + "/local"
        try FileManager.default.createDirectory(atPath: local, withIntermediateDirectories: true)
        chmod(m.base, 0o755)  // other users must reach both trees
        let tool = packageRoot.appendingPathComponent("Tests/MountTests/tools/permissions.py").path
        let r = shell("python3 \(tool) \(m.mnt) \(local)")
        #expect(r.status == 0, "\(r.out)\(r.err)")
    }

    /// A user's own mount (mounted by a user, no allow_other: only that user enters) keeps the
    /// rules ext4 keeps for a user: modes of the user's own files and folders, files of
    /// another user that come in from another device (as others, through the user's group and
    /// through a supplementary group), sticky folders, chown and chgrp, times, truncation,
    /// xattrs, exec. The checks run as that user on both trees (tools/user_permissions.py).
    /// (The kernel makes them today, `default_permissions`; a daemon that makes them itself
    /// must keep every answer.)
    @Test func aUsersOwnMountFollowsTheLocalDiskRules() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-mt-user-\(UUID().uuidString.prefix(8))").path
        let (store, mnt, local, home) = (base + "/store", base + "/b", base + "/local", base + "/home")
        defer {
            let pid = (try? String(contentsOfFile: home + "/ubiq-state/lock", encoding: .utf8))
                .flatMap { $0.split(separator: "\n").first.flatMap { Int32($0) } }
            shell("fusermount3 -u -z '\(mnt)' 2>/dev/null || true")
            if let pid {
                waitUntil(seconds: 10, every: 0.05) { kill(pid, 0) != 0 }
                if kill(pid, 0) == 0 { kill(pid, SIGKILL); usleep(100_000) }
            }
            try? FileManager.default.removeItem(atPath: base)
        }
        for d in [store, local, mnt, home] { try FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true) }
        chmod(base, 0o755)
        // The user is `nobody` (fusermount3 wants a user with a name): a copy of the binary and
        // of the checks where it can reach them, wherever the suite was checked out.
        let (binary, tool) = (base + "/ubiq", base + "/user_permissions.py")
        try FileManager.default.copyItem(atPath: ubiqBinary, toPath: binary)
        try FileManager.default.copyItem(atPath: packageRoot.appendingPathComponent("Tests/MountTests/tools/user_permissions.py").path,
                                         toPath: tool)
        chmod(binary, 0o755)
        chmod(tool, 0o644)
        // The same files of user 1502 in both trees: on the mount they come from another
        // device (root's own mount of the same store), as they would from another machine.
        let others = """
            make_others() {
              d=$1/others; mkdir -p $d
              for m in 644 600 666; do echo x > $d/f$m; chmod $m $d/f$m; done
              echo x > $d/g660; chmod 660 $d/g660
              echo x > $d/sup640; chmod 640 $d/sup640
              mkdir $d/d711; echo x > $d/d711/inner; chmod 644 $d/d711/inner; chmod 711 $d/d711
              mkdir $d/sup710; echo x > $d/sup710/inner; chmod 644 $d/sup710/inner; chmod 710 $d/sup710
              mkdir $d/sticky; chmod 1777 $d/sticky; echo x > $d/sticky/theirs; chmod 666 $d/sticky/theirs
              chown 1502:1502 $d $d/f644 $d/f600 $d/f666 $d/d711 $d/d711/inner $d/sticky $d/sticky/theirs
              chown 1502:65534 $d/g660; chown 1502:1503 $d/sup640 $d/sup710; chown 1502:1502 $d/sup710/inner
              chmod 755 $d
            }
            """
        let a = try MountFixture(store: store, name: "device-a")
        defer { a.cleanup() }
        expectOK(a.sh(others + "\nmake_others ."))
        expectOK(a.unmount())
        expectOK(shell(others + "\nmake_others '\(local)' && chown 65534:65534 '\(local)' && chown -R 65534:65534 '\(store)' '\(mnt)' '\(home)'"))
        let user = "setpriv --reuid=65534 --regid=65534 --groups=1503"
        let mounted = shell("\(user) env HOME='\(home)' XDG_STATE_HOME='\(home)/xdg' '\(binary)' mount --store 'dir:\(store)' --state '\(home)/ubiq-state' '\(mnt)'")
        try #require(mounted.status == 0, "the user's mount: \(mounted.err)\(mounted.out)")
        let options = readWhole("/proc/self/mounts").split(separator: "\n").first { $0.split(separator: " ").dropFirst().first.map(String.init) == mnt }
        #expect(options?.contains("user_id=65534") == true && options?.contains("allow_other") == false, "\(options ?? "not mounted")")
        // ubiq checks, not the kernel: what follows is ubiq's check alone.
        #expect(options?.contains("default_permissions") == false, "\(options ?? "not mounted")")
        let r = shell("\(user) /usr/bin/python3 '\(tool)' '\(mnt)' '\(local)'")
        #expect(r.status == 0, "\(r.out)\(r.err)")
        #expect(r.out.contains("open 0600 of another for reading: EACCES"), "the checks did not run as the user: \(r.out)")
        #expect(r.out.contains("stat in a 0710 folder of a supplementary group: 2"), "\(r.out)")

        // Another process of the user's, without the supplementary group: the name the first
        // one looked up does not let it through (the kernel asks ubiq again).
        for root in [mnt, local] {
            let other = shell("setpriv --reuid=65534 --regid=65534 --clear-groups stat -c %s '\(root)/others/sup710/inner'")
            #expect(other.status != 0 && other.err.contains("Permission denied"), "\(root): \(other.out)\(other.err)")
        }

        // Another device takes the others' search permission away from a folder whose names
        // the user's processes looked up (the checks above): they stop at it.
        expectOK(shell("\(user) stat -c %s '\(mnt)/others/d711/inner'"), "looked up before the change")
        try a.mount()
        expectOK(a.sh("chmod 700 others/d711"))
        expectOK(a.ubiq("sync \(a.mnt)"))
        expectOK(shell("\(user) env HOME='\(home)' XDG_STATE_HOME='\(home)/xdg' '\(binary)' sync '\(mnt)'"))
        expectOK(shell("[ \"$(\(user) stat -c %a '\(mnt)/others/d711')\" = 700 ]"), "the change arrived")
        let after = shell("\(user) stat -c %s '\(mnt)/others/d711/inner'")
        #expect(after.status != 0 && after.err.contains("Permission denied"), "\(after.out)\(after.err)")
    }
}
