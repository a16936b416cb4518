import Foundation
import Synchronization
import Testing
import UbiqFS
@testable import UbiqStore
@testable import UbiqSync

/// A store that holds each put and copy a while (a round trip to a distant store) and counts
/// the most it had under way at once.
final class InFlightStore: ForwardingStore, @unchecked Sendable {
    let hold: Duration
    private let counts = Mutex((now: 0, most: 0))
    var most: Int { counts.withLock { $0.most } }
    init(_ inner: any CloudStore, hold: Duration) {
        self.hold = hold
        super.init(inner)
    }

    private func held<T>(_ body: () async throws -> T) async throws -> T {
        counts.withLock { $0.now += 1; $0.most = max($0.most, $0.now) }
        defer { counts.withLock { $0.now -= 1 } }
        try await Task.sleep(for: hold)
        return try await body()
    }

    override func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata, condition: WriteCondition) async throws -> ObjectInfo {
        try await held { try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition) }
    }
    override func copy(from source: String, version: String, to destination: String, metadata: ObjectMetadata?,
                       condition: WriteCondition) async throws -> ObjectInfo {
        try await held { try await inner.copy(from: source, version: version, to: destination, metadata: metadata, condition: condition) }
    }
}

/// Uploads go side by side (`--transfers`), and never in an order another device could see
/// as something this one did not do.
@Suite struct UploadLanesTests {
    /// Twelve new files reach the store up to four at a time with `--transfers 4`, one at a
    /// time with 1, and whole either way.
    @Test(arguments: [1, 4]) func uploadsGoUpToTransfersAtOnce(transfers: Int) throws {
        let store = try newStore()
        let slow = InFlightStore(store, hold: .milliseconds(50))
        let a = try Device(store: store, remote: slow, transfers: transfers)
        for i in 0 ..< 12 { try a.write("f\(i)", "file \(i)") }
        a.sync()
        if transfers == 1 {
            #expect(slow.most == 1)
        } else {
            #expect(slow.most > 1 && slow.most <= transfers, "most at once: \(slow.most)")
        }
        for i in 0 ..< 12 { #expect(try contents(store, "f\(i)") == "file \(i)") }
        let b = try Device(store: store)
        #expect(try b.names("").count == 12)
    }

    /// Moves that take a name another item had (`mv b c; mv a b`, a swap through a third
    /// name) and a new folder with files in it, among unrelated new files: each key ends with
    /// the bytes it has here, on another device too.
    @Test func movesOntoAnotherItemsNameKeepTheirOrder() throws {
        let store = try newStore()
        let slow = InFlightStore(store, hold: .milliseconds(10))
        let a = try Device(store: store, remote: slow, transfers: 4)
        for (name, text) in [("a", "A"), ("b", "B"), ("p", "P"), ("q", "Q")] { try a.write(name, text) }
        a.sync()
        for (from, to) in [("b", "c"), ("a", "b"), ("p", "t"), ("q", "p"), ("t", "q")] {
            try a.fs.rename(rootIno, n(from), rootIno, n(to))
        }
        for i in 0 ..< 6 { try a.write("n\(i)", "new \(i)") }
        try a.mkdir("d")
        for i in 0 ..< 3 { try a.write("d/x\(i)", "in d \(i)") }
        a.sync()
        let keys = try runBlocking { try await store.list(prefix: "") }.map(\.key).sorted()
        #expect(keys == ["b", "c", "d/", "d/x0", "d/x1", "d/x2", "n0", "n1", "n2", "n3", "n4", "n5", "p", "q"])
        let expected = ["b": "A", "c": "B", "p": "Q", "q": "P", "d/x1": "in d 1", "n5": "new 5"]
        for (key, text) in expected { #expect(try contents(store, key) == text, "\(key)") }
        let b = try Device(store: store)
        for (key, text) in expected { #expect(try b.read(key) == text, "\(key)") }
        #expect(a.log.count("conflict") == 0, "\(a.log.all)")
    }

    /// The order rules themselves: folders alone in their place; items apart together; an
    /// item whose keys meet an earlier one's after the others, in order.
    @Test func stagesKeepWhatMeetsInOrder() {
        func k(_ names: String...) -> Set<KeyBytes>? { Set(names.map { KeyBytes($0) }) }
        typealias S = Uploader.Stage
        // mv b c; mv a b; two new files; a folder; then a file in it and one that meets a file before the folder.
        let keys: [Set<KeyBytes>?] = [k("c", "b"), k("b", "a"), k("n0"), k("n1"), nil, k("d/x"), k("n0")]
        #expect(Uploader.stages(keys) == [S.together([0, 2, 3]), .alone(1), .alone(4), .together([5, 6])])
        // A chain: each after the one before.
        #expect(Uploader.stages([k("x"), k("x", "y"), k("y", "z"), k("w")]) == [S.together([0, 3]), .alone(1), .alone(2)])
        #expect(Uploader.stages([nil, nil]) == [S.alone(0), .alone(1)])
        #expect(Uploader.stages([]) == [])
    }
}
