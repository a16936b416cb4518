import Foundation
import Testing
import TestSupport
@testable import UbiqStore

/// A wrapper that shapes content sees all of it: every put (with progress or without) and
/// every read (into memory or into a file) goes through the two calls it writes.
@Suite struct StoreDecoratorTests {
    /// One way of a slowed link is shared by every transfer on it (`--bwlimit` limits the
    /// mount's uploads together, not each): a transfer waits for those before it, and an idle
    /// link owes nothing.
    @Test func aLinkIsSharedByEveryTransferOnIt() {
        let link = LinkPace(bytesPerSecond: 1000)
        func near(_ a: Double, _ b: Double) -> Bool { abs(a - b) < 1e-9 }
        #expect(near(link.reserve(500, now: 0), 0.5))
        #expect(near(link.reserve(500, now: 0), 1.0), "a second transfer at once waits for the first")
        #expect(near(link.reserve(250, now: 0.5), 0.75))
        #expect(near(link.reserve(100, now: 10), 0.1), "an idle link is free at once")
        #expect(near(link.reserve(0, now: 10), 0.1) && near(link.reserve(-5, now: 10.1), 0))
    }

    static func store() throws -> (DirectoryStore, () -> Void) {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-store-\(UUID().uuidString)")
        return (try DirectoryStore(root: dir), { try? FileManager.default.removeItem(at: dir) })
    }

    @Test func everyPutAndReadCrossesTheWrapper() async throws {
        let (base, cleanup) = try Self.store()
        defer { cleanup() }
        let counting = CountingStore(base)
        let meta = ObjectMetadata(kind: .file)
        _ = try await counting.put("a", contentsOf: try tempFile([1, 2, 3]), metadata: meta, condition: .ifAbsent)
        let b = try await counting.put("b", contentsOf: try tempFile(Array(repeating: 7, count: 10_000)), metadata: meta,
                                       condition: .ifAbsent, progress: { _ in })
        #expect(counting.puts == 2)
        let path = TempPaths.make("ubiq-into")
        FileManager.default.createFile(atPath: path.path, contents: nil)
        let fd = open(path.path, O_RDWR)
        defer { close(fd) }
        let n = try await counting.read("b", version: b.version, range: 0 ..< 10_000, into: fd, at: 0)
        _ = try await counting.read("b", version: b.version, range: 0 ..< 100)
        #expect(n == 10_000 && counting.reads == 2 && counting.bytesRead == 10_100)
        #expect(try Data(contentsOf: path) == Data(repeating: 7, count: 10_000))
    }

    /// A fault set on puts fails a put with progress too (an upload sends with progress).
    @Test func aFaultOnPutsFailsAnUpload() async throws {
        let (base, cleanup) = try Self.store()
        defer { cleanup() }
        let faulty = FaultyStore(base)
        faulty.fail(.put)
        await #expect(throws: StoreError.self) {
            _ = try await faulty.put("a", contentsOf: nil, metadata: ObjectMetadata(kind: .file), condition: .ifAbsent,
                                     progress: { _ in })
        }
        #expect((try? await base.head("a")) == nil)
    }

    /// The prefix store keeps every key inside its prefix, whatever the call.
    @Test func aPrefixStoreKeepsEveryCallInsideItsPrefix() async throws {
        let (base, cleanup) = try Self.store()
        defer { cleanup() }
        let inner = PrefixStore(base, prefix: "in/")
        let meta = ObjectMetadata(kind: .file)
        let a = try await inner.put("a", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent, progress: nil)
        _ = try await inner.copy(from: "a", version: a.version, to: "b", metadata: nil, condition: .ifAbsent)
        let b = try await inner.head("b")
        try await inner.deleteMoved("b", version: b.version, to: "c")
        #expect(try await base.list(prefix: "").map(\.key) == ["in/a"])
        #expect(try await inner.versions(of: "a").allSatisfy { $0.key == "a" })
    }
}
