import Foundation
import Testing

/// Random POSIX operations on the mount and on a local directory, compared
/// step by step (tools/fsrandom.py). The seed is printed: set UBIQ_SEED to replay.
@Suite(.serialized) struct RandomOperationTests {
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
}
