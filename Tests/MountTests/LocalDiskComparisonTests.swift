import Foundation
import Testing

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
}
