import Foundation
import Testing
import TestSupport
@testable import UbiqS3
@testable import UbiqStore

/// Makes a fresh store of each kind: the embedded one, and S3 on a real SeaweedFS in a
/// bucket without versioning and in one with it.
enum StoreKind: String, CaseIterable, CustomTestStringConvertible {
    case directory, container, decorated, s3, s3Versioned
    var testDescription: String { rawValue }
    /// S3 finds changes by comparing listings (no journal).
    var comparesListings: Bool { self == .s3 || self == .s3Versioned }

    func make() async throws -> (any CloudStore, cleanup: () -> Void) {
        switch self {
        case .directory:
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-store-\(UUID().uuidString)")
            return (try DirectoryStore(root: dir, keptVersions: 3), { try? FileManager.default.removeItem(at: dir) })
        case .container:
            // A container: the embedded store seen through a prefix, with a neighbour beside it.
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-store-\(UUID().uuidString)")
            let base = try DirectoryStore(root: dir, keptVersions: 3)
            _ = try await base.put(".ubiquity/containers/other/x/1", contentsOf: nil, metadata: ObjectMetadata(kind: .file), condition: .always)
            return (PrefixStore(base, prefix: ".ubiquity/containers/app/"), { try? FileManager.default.removeItem(at: dir) })
        case .decorated:
            // The embedded store through every wrapper at once, each doing nothing: a
            // `StoreDecorator` hands on all it does not shape.
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-store-\(UUID().uuidString)")
            let base = try DirectoryStore(root: dir, keptVersions: 3)
            let wrapped = CountingStore(ThrottledStore(FaultyStore(base), bytesPerSecond: 1e15, writeBytesPerSecond: 1e15))
            return (wrapped, { try? FileManager.default.removeItem(at: dir) })
        case .s3, .s3Versioned:
            return try await SeaweedFS.shared().newStore(versioned: self == .s3Versioned)
        }
    }
}


func tempFile(_ bytes: [UInt8]) throws -> URL {
    let url = TempPaths.make("ubiq-src")
    try Data(bytes).write(to: url)
    return url
}

let fileMeta = ObjectMetadata(kind: .file, mode: 0o640, uid: 1000, gid: 1000, mtimeNs: 1_700_000_000_123_456_789,
                              xattrs: ["user.color": Data("blue".utf8)])

/// One conformance suite, run against every store.
@Suite struct StoreConformanceTests {
    @Test(arguments: StoreKind.allCases)
    func putHeadReadRoundTrip(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        let bytes = (0 ..< 100_000).map { UInt8($0 % 251) }
        let src = try tempFile(bytes)
        let info = try await store.put("a/b/c.bin", contentsOf: src, metadata: fileMeta, condition: .ifAbsent)
        #expect(info.size == 100_000)
        let head = try await store.head("a/b/c.bin")
        #expect(head.version == info.version)
        #expect(head.metadata == fileMeta)
        let all = try await store.read("a/b/c.bin", version: info.version, range: 0 ..< 1_000_000)
        #expect(bytesDiffer(all, bytes) == nil)
        let part = try await store.read("a/b/c.bin", version: info.version, range: 99_990 ..< 100_010)
        #expect([UInt8](part) == Array(bytes[99_990...]))
    }

    @Test(arguments: StoreKind.allCases)
    func conditionalWrites(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        let v1 = try await store.put("k", contentsOf: try tempFile([1]), metadata: fileMeta, condition: .ifAbsent)
        await #expect(throws: StoreError.preconditionFailed(key: "k", current: v1.version)) {
            try await store.put("k", contentsOf: try tempFile([2]), metadata: fileMeta, condition: .ifAbsent)
        }
        let v2 = try await store.put("k", contentsOf: try tempFile([2]), metadata: fileMeta, condition: .ifMatch(v1.version))
        #expect(v2.version != v1.version)
        // An edit that started from v1 loses against v2: that is a conflict, never an overwrite.
        await #expect(throws: StoreError.self) {
            try await store.put("k", contentsOf: try tempFile([3]), metadata: fileMeta, condition: .ifMatch(v1.version))
        }
        let now = try await store.read("k", version: v2.version, range: 0 ..< 10)
        #expect([UInt8](now) == [2])
        await #expect(throws: StoreError.self) { try await store.delete("k", condition: .ifMatch(v1.version)) }
        try await store.delete("k", condition: .ifMatch(v2.version))
        await #expect(throws: StoreError.notFound(key: "k")) { try await store.head("k") }
        try await store.delete("k", condition: .always)  // absent: fine
    }

    /// A move's second half (`deleteMoved`): to the device that makes it, the old key is gone
    /// at once, whenever the store makes the delete; its copy stays. Anything this device then
    /// writes at the old key is not undone by the delete.
    @Test(arguments: StoreKind.allCases)
    func aMovesDeleteIsSeenAtOnce(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        let v = try await store.put("d/x", contentsOf: try tempFile([1]), metadata: fileMeta, condition: .ifAbsent)
        let moved = try await store.copy(from: "d/x", version: v.version, to: "e/x", metadata: nil, condition: .ifAbsent)
        try await store.deleteMoved("d/x", version: v.version, to: "e/x")
        await #expect(throws: StoreError.notFound(key: "d/x")) { try await store.head("d/x") }
        #expect(try await store.list(prefix: "").map(\.key).filter { $0.hasSuffix("x") } == ["e/x"])
        #expect(try await store.head("e/x").version == moved.version)
        let again = try await store.put("d/x", contentsOf: try tempFile([2]), metadata: fileMeta, condition: .ifAbsent)
        try await store.publishChanges()
        #expect(try await store.head("d/x").version == again.version)
    }

    @Test(arguments: StoreKind.allCases)
    func readsArePinnedToAVersion(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        let v1 = try await store.put("f", contentsOf: try tempFile([1, 1, 1]), metadata: fileMeta, condition: .always)
        _ = try await store.put("f", contentsOf: try tempFile([2, 2, 2]), metadata: fileMeta, condition: .always)
        let versions = try await store.versions(of: "f")
        if store.keepsPriorVersions {
            // The old version is still readable as a prior version, never mixed with the new.
            let old = try await store.read("f", version: v1.version, range: 0 ..< 3)
            #expect([UInt8](old) == [1, 1, 1])
            #expect(versions.count == 2)
            #expect(versions.last?.version == v1.version)
        } else {
            // Gone with its bytes: reading it fails rather than give the new bytes.
            await #expect(throws: StoreError.notFound(key: "f")) { try await store.read("f", version: v1.version, range: 0 ..< 3) }
            #expect(versions.count == 1)
        }
        await #expect(throws: StoreError.notFound(key: "f")) { try await store.read("f", version: "nope", range: 0 ..< 1) }
    }

    /// Reading into a file (what downloads do) gives the same bytes as reading, at the
    /// offset asked, clamped to the object; content tags tell new bytes from a metadata change.
    @Test(arguments: StoreKind.allCases)
    func readIntoAFileAndContentTags(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        let bytes = (0 ..< 300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let v = try await store.put("f", contentsOf: try tempFile(bytes), metadata: fileMeta, condition: .always)
        let out = try tempFile([UInt8](repeating: 0xAA, count: 10))
        let fd = open(out.path, O_RDWR)
        defer { close(fd); try? FileManager.default.removeItem(at: out) }
        #expect(try await store.read("f", version: v.version, range: 1000 ..< 2000, into: fd, at: 5) == 1000)
        #expect(try await store.read("f", version: v.version, range: 299_990 ..< 400_000, into: fd, at: 2000) == 10)
        let file = [UInt8](try Data(contentsOf: out))
        try #require(file.count == 2010)
        #expect(Array(file[0 ..< 5]) == [0xAA, 0xAA, 0xAA, 0xAA, 0xAA])
        #expect(Array(file[5 ..< 1005]) == Array(bytes[1000 ..< 2000]))
        #expect(Array(file[2000 ..< 2010]) == Array(bytes[299_990 ..< 300_000]))
        await #expect(throws: StoreError.notFound(key: "f")) {
            try await store.read("f", version: "nope", range: 0 ..< 1, into: fd, at: 0)
        }
        // A metadata change keeps the tag; new bytes change it.
        var m = fileMeta
        m.mode = 0o600
        let meta = try await store.copy(from: "f", version: v.version, to: "f", metadata: m, condition: .ifMatch(v.version))
        let edit = try await store.put("f", contentsOf: try tempFile([1]), metadata: fileMeta, condition: .always)
        if let tag = v.contentTag {
            #expect(meta.contentTag == tag)
            #expect(try await store.head("f").contentTag == edit.contentTag)
            #expect(edit.contentTag != tag)
        }
    }

    @Test(arguments: StoreKind.allCases)
    func priorVersionsAreBounded(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        for i in 0 ..< 8 { _ = try await store.put("f", contentsOf: try tempFile([UInt8(i)]), metadata: fileMeta, condition: .always) }
        let versions = try await store.versions(of: "f")
        // The embedded store keeps `keptVersions` (3) besides the current one; a versioned
        // bucket keeps what its lifecycle rules say (here: all); an unversioned one, none.
        switch kind {
        case .directory, .container, .decorated: #expect(versions.count == 4)
        case .s3Versioned: #expect(versions.count == 8)
        case .s3: #expect(versions.count == 1)
        }
        #expect(versions.first?.version == (try await store.head("f")).version)
    }

    @Test(arguments: StoreKind.allCases)
    func serverSideCopyAndMetadataUpdate(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        let v = try await store.put("src", contentsOf: try tempFile([9, 8, 7]), metadata: fileMeta, condition: .ifAbsent)
        let c = try await store.copy(from: "src", version: v.version, to: "dir/dst", metadata: nil, condition: .ifAbsent)
        #expect(c.size == 3)
        #expect([UInt8](try await store.read("dir/dst", version: c.version, range: 0 ..< 3)) == [9, 8, 7])
        var m = fileMeta
        m.mode = 0o600
        let u = try await store.copy(from: "src", version: v.version, to: "src", metadata: m, condition: .ifMatch(v.version))
        #expect(try await store.head("src").metadata.mode == 0o600)
        #expect(u.version != v.version)
    }

    @Test(arguments: StoreKind.allCases)
    func listingAndChangeFeed(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        let start = try await store.changes(since: nil, limit: 1000)
        _ = try await store.put("x/", contentsOf: nil, metadata: ObjectMetadata(kind: .directory), condition: .ifAbsent)
        _ = try await store.put("x/1", contentsOf: try tempFile([1]), metadata: fileMeta, condition: .ifAbsent)
        _ = try await store.put("y", contentsOf: try tempFile([1]), metadata: fileMeta, condition: .ifAbsent)
        try await store.delete("y", condition: .always)
        let listed = try await store.list(prefix: "x/").map(\.key)
        #expect(listed == ["x/", "x/1"])
        #expect(try await store.list(prefix: "").map(\.key) == ["x/", "x/1"])
        // S3 times are in seconds: what changed in the last two seconds is reported once more
        // at the next poll (a change within the same second would be unseen otherwise).
        if kind.comparesListings { try await Task.sleep(for: .seconds(2.2)) }
        let feed = try await store.changes(since: start.cursor, limit: 1000)
        // A store with a journal reports y's put and delete; one that compares listings
        // (S3) never saw y. Either way, y ends deleted.
        #expect(feed.changes.filter { $0.key != "y" }.map(\.key) == ["x/", "x/1"])
        if let last = feed.changes.last(where: { $0.key == "y" }) { #expect(last.kind == .delete) }
        let after = try await store.changes(since: feed.cursor, limit: 1000)
        #expect(after.changes.isEmpty)
        // Every change after a cursor comes after it: an edit, a metadata change, a delete.
        _ = try await store.put("x/1", contentsOf: try tempFile([2]), metadata: fileMeta, condition: .always)
        let edit = try await store.changes(since: after.cursor, limit: 1000)
        #expect(edit.changes.map(\.key) == ["x/1"])
        let v = try await store.head("x/1")
        var m = fileMeta
        m.mode = 0o600
        _ = try await store.copy(from: "x/1", version: v.version, to: "x/1", metadata: m, condition: .ifMatch(v.version))
        let chmod = try await store.changes(since: edit.cursor, limit: 1000)
        #expect(chmod.changes.map(\.key).contains("x/1"))
        #expect(try await store.head("x/1").version != v.version)
        try await store.delete("x/1", condition: .always)
        let gone = try await store.changes(since: chmod.cursor, limit: 1000)
        #expect(gone.changes.map(\.kind) == [.delete] && gone.changes.map(\.key) == ["x/1"])
        // A cursor the store does not know is a reset, never a silent miss.
        let stale = try await store.changes(since: start.cursor, limit: 1000)
        if kind.comparesListings { #expect(stale.reset) }
    }

    /// The listing in pages (an import takes it so) is the listing: every object once, in key
    /// order, under the prefix only, whatever the page size; with only the objects the caller
    /// wants described.
    @Test(arguments: StoreKind.allCases)
    func aListingInPagesIsTheListing(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        for key in ["a/", "a/1", "a/2", "a/b/", "a/b/c", "a-z", "b", "é", "z/9"] {
            _ = try await store.put(key, contentsOf: key.hasSuffix("/") ? nil : try tempFile([1]),
                                    metadata: key.hasSuffix("/") ? ObjectMetadata(kind: .directory) : fileMeta, condition: .ifAbsent)
        }
        for prefix in ["", "a/"] {
            let whole = try await store.list(prefix: prefix).map(\.key)
            #expect(whole.count == (prefix.isEmpty ? 9 : 5))
            for size in [1, 2, 4, 100] {
                var pages: [[String]] = []
                try await store.list(prefix: prefix, pagesOf: size) { pages.append($0.map(\.key)) }
                #expect(pages.allSatisfy { !$0.isEmpty && $0.count <= size }, "pages of \(size)")
                #expect(pages.flatMap { $0 } == whole, "pages of \(size) under \(prefix.debugDescription)")
                // Only what is wanted described: every key offered once, in order; the pages
                // handed on hold the wanted ones (none empty).
                var offered: [String] = []
                var kept: [[String]] = []
                try await store.list(prefix: prefix, pagesOf: size, wanted: { keys in
                    #expect(!keys.isEmpty && keys.count <= size)
                    offered += keys
                    return keys.map { $0.utf8.count % 2 == 1 }
                }) { kept.append($0.map(\.key)) }
                #expect(offered == whole, "offered in pages of \(size)")
                #expect(kept.allSatisfy { !$0.isEmpty } && kept.flatMap { $0 } == whole.filter { $0.utf8.count % 2 == 1 },
                        "kept in pages of \(size): \(kept)")
            }
        }
    }

    @Test(arguments: StoreKind.allCases)
    func hostileKeysAreRefused(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        for key in ["", "/", "a//b", "../x", "a/../b", "a/./b", "a\0b", String(repeating: "n", count: 256)] {
            await #expect(throws: StoreError.self, "key \(key.debugDescription)") {
                try await store.put(key, contentsOf: nil, metadata: fileMeta, condition: .always)
            }
        }
    }

    @Test(arguments: StoreKind.allCases)
    func racingCreatesHaveOneWinner(kind: StoreKind) async throws {
        let (store, cleanup) = try await kind.make()
        defer { cleanup() }
        let src = try tempFile([1, 2, 3])
        let results = await withTaskGroup(of: Bool.self) { group in
            for _ in 0 ..< 8 {
                group.addTask {
                    (try? await store.put("race", contentsOf: src, metadata: fileMeta, condition: .ifAbsent)) != nil
                }
            }
            var wins = 0
            for await ok in group where ok { wins += 1 }
            return wins
        }
        #expect(results == 1)
    }
}

@Suite struct DirectoryStoreTests {
    /// What a device killed mid-upload left in tmp/ goes once it is a day old; a fresh one stays.
    @Test func abandonedUploadsAreRemoved() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-store-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        _ = try DirectoryStore(root: dir)
        let tmp = dir.appendingPathComponent("tmp")
        let old = tmp.appendingPathComponent("abandoned").path, fresh = tmp.appendingPathComponent("under-way").path
        #expect(FileManager.default.createFile(atPath: old, contents: Data(count: 100)))
        #expect(FileManager.default.createFile(atPath: fresh, contents: Data(count: 100)))
        try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSinceNow: -25 * 3600)], ofItemAtPath: old)
        _ = try DirectoryStore(root: dir)
        #expect(!FileManager.default.fileExists(atPath: old))
        #expect(FileManager.default.fileExists(atPath: fresh))
    }

    @Test func quotaRefusesWhatWouldNotFit() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-store-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let store = try DirectoryStore(root: dir)
        #expect(try await store.usage() == StoreUsage(usedBytes: 0, quotaBytes: nil))
        try store.setQuota(1000)
        _ = try await store.put("a", contentsOf: try tempFile([UInt8](repeating: 1, count: 600)), metadata: fileMeta, condition: .ifAbsent)
        await #expect(throws: StoreError.quotaExceeded(key: "b")) {
            try await store.put("b", contentsOf: try tempFile([UInt8](repeating: 2, count: 600)), metadata: fileMeta, condition: .ifAbsent)
        }
        // Replacing a file counts its new size instead of the old one.
        _ = try await store.put("a", contentsOf: try tempFile([UInt8](repeating: 3, count: 900)), metadata: fileMeta, condition: .always)
        #expect(try await store.usage() == StoreUsage(usedBytes: 900, quotaBytes: 1000))
        try store.setQuota(nil)
        _ = try await store.put("b", contentsOf: try tempFile([UInt8](repeating: 2, count: 600)), metadata: fileMeta, condition: .ifAbsent)
    }
}
