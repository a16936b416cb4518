import Foundation
import Testing
import TestSupport
import UbiqStore
@testable import UbiqSync

/// The synced key-value store on a real store: limits at and over each bound, last writer
/// wins everywhere, removals, and the values' types.
@Suite struct KeyValueTests {
    func store() throws -> DirectoryStore { try DirectoryStore(root: TempPaths.make("ubiq-kv-store")) }

    /// Puts an entry as `write` does, without its checks.
    func seed(_ s: DirectoryStore, _ e: KVEntry) async throws {
        let body = TempPaths.make("ubiq-kv-body")
        try e.encoded().write(to: body)
        _ = try await s.put(KVStoreClient.objectKey(e.key), contentsOf: body, metadata: KVStoreClient.metadata(e), condition: .always)
    }

    @Test func valuesOfEveryTypeRoundTrip() async throws {
        let s = try store()
        let a = KVStoreClient(store: s, device: "a")
        let values: [String: KVValue] = [
            "s": .string("dark ☾"), "n": .number(42.5), "b": .bool(true),
            "j": try KVValue.parse(#"{"w": 800, "tags": ["x"]}"#, as: "json"), "bytes": .bytes(Data([0, 1, 255])),
        ]
        for (k, v) in values { try await a.write(KVEntry(key: k, value: v, timeNs: 1, device: "a")) }
        for (k, v) in values {
            let got = try #require(try await a.get(k)).value
            if case .json = v { #expect(got == .json(#"{"tags":["x"],"w":800}"#)) } else { #expect(got == v) }
        }
        #expect(try await a.list().map(\.key) == ["b", "bytes", "j", "n", "s"])
        #expect(throws: KVError.self) { try KVValue.parse("12x", as: "number") }
        #expect(throws: KVError.self) { try KVValue.parse("{", as: "json") }
        #expect(throws: KVError.self) { try KVValue.parse("maybe", as: "bool") }
        #expect(throws: KVError.self) { try KVValue.parse("@@", as: "bytes") }
    }

    /// Keys of 64 bytes go in, 65 do not; 1,024 keys go in, the 1,025th does not; 1 MB in all
    /// goes in, a byte more does not. A refused write changes nothing.
    @Test func limitsAtAndOverEachBound() async throws {
        let s = try store()
        let a = KVStoreClient(store: s, device: "a")
        let k64 = String(repeating: "é", count: 32)  // 64 bytes of UTF-8
        try await a.write(KVEntry(key: k64, value: .bool(true), timeNs: 1, device: "a"))
        await #expect(throws: KVError.self) { try await a.write(KVEntry(key: k64 + "x", value: .bool(true), timeNs: 1, device: "a")) }
        await #expect(throws: KVError.self) { try await a.write(KVEntry(key: "", value: .bool(true), timeNs: 1, device: "a")) }
        try await a.write(KVEntry(key: k64, value: nil, timeNs: 2, device: "a"))  // removed: counts for nothing
        // 1,022 keys put in place directly (the checks cost a listing each), then two through `write`.
        for i in 0 ..< 1022 { try await seed(s, KVEntry(key: "k\(i)", value: .bool(true), timeNs: 1, device: "a")) }
        for i in 1022 ..< 1024 { try await a.write(KVEntry(key: "k\(i)", value: .bool(true), timeNs: 1, device: "a")) }
        await #expect(throws: KVError.self) { try await a.write(KVEntry(key: "one-more", value: .bool(true), timeNs: 1, device: "a")) }
        #expect(try await a.get("one-more") == nil)
        try await a.write(KVEntry(key: "k0", value: .string("changed"), timeNs: 2, device: "a"))  // a key already there: fine
        for i in 1 ..< 1024 { try await seed(s, KVEntry(key: "k\(i)", value: nil, timeNs: 3, device: "a")) }
        // Bytes: "k0" takes 2 + its value; fill to exactly 1 MB, then one byte over.
        let room = KVLimits.totalBytes - 2 - "big".utf8.count
        try await a.write(KVEntry(key: "k0", value: .bool(true), timeNs: 4, device: "a"))  // 2 + 1 bytes
        await #expect(throws: KVError.self) {
            try await a.write(KVEntry(key: "big", value: .bytes(Data(count: room)), timeNs: 5, device: "a"))
        }
        try await a.write(KVEntry(key: "big", value: .bytes(Data(count: room - 1)), timeNs: 5, device: "a"))
        #expect(try await a.get("big")?.value?.size == room - 1)
        await #expect(throws: KVError.self) { try await a.write(KVEntry(key: "k0", value: .string("xx"), timeNs: 6, device: "a")) }
        #expect(try await a.get("k0")?.value == .bool(true))
    }

    /// Sets of one key racing from three devices end with one value, the latest, everywhere;
    /// an older write arriving late loses; a removal beats older sets and loses to newer ones.
    @Test func lastWriterWinsEverywhere() async throws {
        let s = try store()
        let devices = ["a", "b", "c"].map { KVStoreClient(store: s, device: $0) }
        await withTaskGroup(of: Void.self) { group in
            for (i, d) in devices.enumerated() {
                for j in 0 ..< 10 {
                    group.addTask {
                        _ = try? await d.write(KVEntry(key: "k", value: .number(Double(i * 100 + j)),
                                                       timeNs: Int64(1000 + j * 3 + i), device: d.device))
                    }
                }
            }
        }
        let best = KVEntry(key: "k", value: .number(209), timeNs: Int64(1000 + 9 * 3 + 2), device: "c")
        for d in devices { #expect(try await d.get("k") == best) }
        // Late and older: loses, and says what stands.
        let late = try await devices[0].write(KVEntry(key: "k", value: .number(-1), timeNs: 5, device: "a"))
        #expect(late == best)
        // A tie on time goes to the greater device id.
        let tieA = KVEntry(key: "t", value: .string("a"), timeNs: 7, device: "a"), tieB = KVEntry(key: "t", value: .string("b"), timeNs: 7, device: "b")
        try await devices[1].write(tieB)
        #expect(try await devices[0].write(tieA) == tieB)
        // Removal.
        try await devices[1].write(KVEntry(key: "k", value: nil, timeNs: 2000, device: "b"))
        #expect(try await devices[2].get("k")?.value == nil)
        #expect(try await devices[2].list().map(\.key) == ["t"])
        #expect(try await devices[0].write(KVEntry(key: "k", value: .bool(false), timeNs: 1999, device: "a")).value == nil)
        try await devices[0].write(KVEntry(key: "k", value: .bool(false), timeNs: 2001, device: "a"))
        #expect(try await devices[2].get("k")?.value == .bool(false))
    }

    /// An entry read short (a busy server's empty or cut answer) is read again; one that stays
    /// short is the store's transient failure (tried again later), never "unreadable", which
    /// says the entry itself is bad.
    @Test func anEntryReadShortIsReadAgain() async throws {
        let s = try store()
        try await KVStoreClient(store: s, device: "a").write(KVEntry(key: "k", value: .string("a value long enough to cut"), timeNs: 1, device: "a"))
        let faulty = FaultyStore(s)
        let b = KVStoreClient(store: faulty, device: "b")
        var chaos = FaultyStore.Chaos(seed: 1)
        chaos.short = 1
        faulty.setChaos(chaos)
        do {
            _ = try await b.get("k")
            Issue.record("a short read was taken")
        } catch let e as StoreError {
            #expect(e.isTransient && "\(e)".contains("bytes"), "\(e)")
        }
        #expect(faulty.faultsInjected["short"] == 2)
        faulty.setChaos(nil)
        #expect(try await b.get("k")?.value == .string("a value long enough to cut"))
    }

    /// The key-value store's objects are not files: a mount's import leaves them out.
    @Test func kvObjectsAreNotFiles() async throws {
        #expect(KVStoreClient.objectKey("a/b") == ".ubiquity/kv/612f62")
        #expect(KVStoreClient.key(fromObjectKey: ".ubiquity/kv/612f62") == "a/b")
        #expect(KVStoreClient.key(fromObjectKey: ".ubiquity/kv/zz") == nil)
        #expect(ReservedKeys.isReserved(".ubiquity/kv/61") && !ReservedKeys.isReserved("ubiquity/x"))
    }
}
