import Foundation
import Synchronization

/// Wraps a store and makes chosen operations fail, to test what the device does
/// when the store is down or answers wrongly. Faults are switched on and off while
/// it runs.
public final class FaultyStore: StoreDecorator, Sendable {
    public enum Operation: Sendable, Hashable { case head, list, read, put, copy, delete, changes }

    public let inner: any CloudStore
    /// Operations that fail, with what, and how many more times (nil: until healed).
    private let failing = Mutex<[Operation: (error: StoreError, times: Int?)]>([:])
    private let losing = Mutex<Set<Operation>>([])
    private let held = Mutex<[Int64: Gate]>([:])

    /// A read held until the test lets it go, then answered or failed.
    private final class Gate: @unchecked Sendable {
        let cond = NSCondition()
        var released = false
        var error: StoreError?
        func pass() throws {
            cond.lock(); defer { cond.unlock() }
            while !released { cond.wait() }
            if let error { throw error }
        }
    }

    /// While a file exists at this path, every operation fails: the store cannot be reached.
    /// (How tests of a mounted daemon take its store away: UBIQ_STORE_OFFLINE_FLAG.)
    public let offlineFlag: String?

    /// While a file exists at this path, a listing of the whole store waits before it begins
    /// (a store slow to list: UBIQ_STORE_LIST_GATE, the test that a mount again answers
    /// meanwhile).
    public let listGate: String?

    /// Random faults, drawn from a seeded generator (nil: none).
    public var chaos: Chaos? { chaosState.withLock { $0 } }
    private let chaosState: Mutex<Chaos?>
    private let rng: Mutex<UInt64>
    private let injected = Mutex<[String: Int]>([:])

    public init(_ inner: any CloudStore, offlineFlag: String? = nil, listGate: String? = nil, chaos: Chaos? = nil) {
        self.inner = inner; self.offlineFlag = offlineFlag; self.listGate = listGate
        chaosState = Mutex(chaos)
        rng = Mutex(chaos?.seed ?? 0)
    }

    /// From now on, these random faults (nil: none); the generator starts again from its seed.
    public func setChaos(_ chaos: Chaos?) {
        chaosState.withLock { $0 = chaos }
        rng.withLock { $0 = chaos?.seed ?? 0 }
    }

    /// Faults drawn at random, each operation on its own: a store on a bad day.
    public struct Chaos: Sendable, Equatable, CustomStringConvertible {
        public var seed: UInt64
        /// Share of operations that fail before reaching the store (transient: unavailable).
        public var fail: Double = 0
        /// Share of writes (put, copy, delete) carried out whose answer is lost.
        public var lose: Double = 0
        /// Share of reads answered with fewer bytes than asked for (a cut connection).
        public var short: Double = 0
        /// Share of reads answered with other bytes than the version asked for, as if they were
        /// it: another version's (a server that ignores the version asked for, a stale cache),
        /// or, when the key has no other version, the same bytes with one changed.
        public var wrong: Double = 0
        /// Share of operations that time out: they wait `timeout` seconds, then fail as unavailable.
        public var hang: Double = 0
        public var timeout: Double = 2
        /// Delay added before every operation, in milliseconds, drawn in this range.
        public var latencyMs: ClosedRange<Int> = 0 ... 0

        public init(seed: UInt64) { self.seed = seed }

        /// `seed=7,fail=0.1,lose=0.05,short=0.1,wrong=0.05,hang=0.01,timeout=2,latency=0-20` (shares 0...1, ms).
        public static func parse(_ text: String) -> Chaos? {
            var c = Chaos(seed: 1)
            for part in text.split(separator: ",") {
                let kv = part.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
                guard kv.count == 2 else { return nil }
                let v = kv[1]
                switch kv[0] {
                case "seed": guard let n = UInt64(v) else { return nil }; c.seed = n
                case "fail", "lose", "short", "wrong", "hang":
                    guard let d = Double(v), (0 ... 1).contains(d) else { return nil }
                    switch kv[0] {
                    case "fail": c.fail = d
                    case "lose": c.lose = d
                    case "short": c.short = d
                    case "wrong": c.wrong = d
                    default: c.hang = d
                    }
                case "timeout": guard let d = Double(v), d >= 0 else { return nil }; c.timeout = d
                case "latency":
                    let r = v.split(separator: "-").compactMap { Int($0) }
                    guard (1 ... 2).contains(r.count), r.allSatisfy({ $0 >= 0 }), r.first! <= r.last! else { return nil }
                    c.latencyMs = r.first! ... r.last!
                default: return nil
                }
            }
            return c
        }

        public var description: String {
            "seed=\(seed),fail=\(fail),lose=\(lose),short=\(short),wrong=\(wrong),hang=\(hang),timeout=\(timeout),latency=\(latencyMs.lowerBound)-\(latencyMs.upperBound)"
        }
    }

    /// How many faults of each kind were injected so far (fail, lose, short, wrong, hang, offline, held).
    public var faultsInjected: [String: Int] { injected.withLock { $0 } }

    private func count(_ kind: String) { injected.withLock { $0[kind, default: 0] += 1 } }

    /// A uniform draw in 0..<1 (splitmix64 over the seed).
    private func draw() -> Double {
        let x = rng.withLock { s -> UInt64 in
            s &+= 0x9E37_79B9_7F4A_7C15
            var z = s
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        return Double(x >> 11) / Double(1 << 53)
    }

    /// Latency, then maybe a failure or a timeout: what every operation meets on its way in.
    private func chaosBefore(_ op: Operation) async throws {
        guard let c = chaos else { return }
        if c.latencyMs.upperBound > 0 {
            let ms = c.latencyMs.lowerBound + Int(draw() * Double(c.latencyMs.count))
            if ms > 0 { try? await Task.sleep(nanoseconds: UInt64(min(ms, c.latencyMs.upperBound)) * 1_000_000) }
        }
        if c.hang > 0, draw() < c.hang {
            count("hang")
            try? await Task.sleep(nanoseconds: UInt64(c.timeout * 1e9))
            throw StoreError.unavailable("injected fault: timed out after \(c.timeout) s")
        }
        if c.fail > 0, draw() < c.fail {
            count("fail")
            throw StoreError.unavailable("injected fault: \(op) failed")
        }
    }

    /// From now on `op` fails with `error` (default: the store is unavailable).
    public func fail(_ op: Operation, with error: StoreError = .unavailable("injected fault")) {
        failing.withLock { $0[op] = (error, nil) }
    }

    /// The next `times` calls of `op` fail (the store unavailable for a moment); the ones after go through.
    public func fail(_ op: Operation, times: Int) {
        failing.withLock { $0[op] = times > 0 ? (.unavailable("injected fault: \(op) failed for a moment"), times) : nil }
    }

    /// From now on `op` is carried out by the store but its answer never comes back: the
    /// caller sees the store unavailable (a reply lost, or a daemon killed just after the write).
    public func loseAnswers(_ op: Operation) {
        _ = losing.withLock { $0.insert(op) }
    }

    public func heal(_ op: Operation? = nil) {
        failing.withLock { if let op { $0[op] = nil } else { $0.removeAll() } }
        losing.withLock { if let op { $0.remove(op) } else { $0.removeAll() } }
        if op == nil || op == .read {
            for gate in held.withLock({ g in defer { g.removeAll() }; return Array(g.values) }) {
                gate.cond.lock(); gate.released = true; gate.error = nil; gate.cond.broadcast(); gate.cond.unlock()
            }
        }
    }

    /// From now on reads of ranges that start at `offset` wait for `release(readsAt:)`.
    public func hold(readsAt offset: Int64) {
        held.withLock { $0[offset] = Gate() }
    }

    /// Lets the held reads at `offset` go on: they read the store, or (given `error`) they and
    /// every later read at `offset` fail with it until `heal()`.
    public func release(readsAt offset: Int64, failing error: StoreError? = nil) {
        guard let gate = held.withLock({ error == nil ? $0.removeValue(forKey: offset) : $0[offset] }) else { return }
        gate.cond.lock()
        gate.released = true
        gate.error = error
        gate.cond.broadcast()
        gate.cond.unlock()
    }

    private func check(_ op: Operation) async throws {
        if let flag = offlineFlag, access(flag, F_OK) == 0 {
            count("offline")
            throw StoreError.unavailable("offline (\(flag) exists)")
        }
        if let e = failing.withLock({ f -> StoreError? in
            guard let (error, times) = f[op] else { return nil }
            if let times { f[op] = times > 1 ? (error, times - 1) : nil }
            return error
        }) {
            count("fail")
            throw e
        }
        try await chaosBefore(op)
    }

    private func answer<T>(_ op: Operation, _ value: T) throws -> T {
        if losing.withLock({ $0.contains(op) }) { count("lose"); throw StoreError.unavailable("injected fault: the answer was lost") }
        if let c = chaos, c.lose > 0, draw() < c.lose {
            count("lose")
            throw StoreError.unavailable("injected fault: the answer to \(op) was lost")
        }
        return value
    }

    public func head(_ key: String) async throws -> ObjectInfo { try await check(.head); return lying(try await inner.head(key)) }

    public func list(prefix: String) async throws -> [ObjectInfo] {
        try await check(.list)
        return try await inner.list(prefix: prefix).map(lying)
    }

    public func list(prefix: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
                     _ body: ([ObjectInfo]) throws -> Void) async throws {
        if let gate = listGate, prefix.isEmpty, access(gate, F_OK) == 0 {
            count("held")
            while access(gate, F_OK) == 0 { try await Task.sleep(for: .milliseconds(20)) }
        }
        try await check(.list)
        try await inner.list(prefix: prefix, pagesOf: size, wanted: wanted) { try body($0.map(lying)) }
    }

    private let sizeLie = Mutex<Int64>(0)

    /// From now on the store describes every file as `delta` bytes longer than its content
    /// (an object whose size lies: a broken server or gateway).
    public func lieAboutSizes(by delta: Int64) { sizeLie.withLock { $0 = delta } }

    private func lying(_ info: ObjectInfo) -> ObjectInfo {
        let delta = sizeLie.withLock { $0 }
        guard delta != 0, info.metadata.kind == .file else { return info }
        var i = info
        i.size = max(0, i.size + delta)
        return i
    }

    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        try await check(.read)
        if let gate = held.withLock({ $0[range.lowerBound] }) { count("held"); try gate.pass() }
        if let c = chaos, c.wrong > 0, !range.isEmpty, draw() < c.wrong {
            count("wrong")
            return try await wrongBytes(key, version: version, range: range)
        }
        let data = try await inner.read(key, version: version, range: range)
        if let c = chaos, c.short > 0, data.count > 1, draw() < c.short {
            count("short")
            return data.prefix(Int(draw() * Double(data.count - 1)))  // the connection cut part-way
        }
        return data
    }

    /// What a read of `version` gets from a store that serves the wrong bytes: another
    /// version's range (its length may differ, as a real one's would), else one byte changed.
    private func wrongBytes(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        let others = try await inner.versions(of: key).filter { $0.version != version && $0.size > range.lowerBound }
        if !others.isEmpty {
            let other = others[Int(draw() * Double(others.count)) % others.count]
            let data = try await inner.read(key, version: other.version, range: range)
            if data != (try await inner.read(key, version: version, range: range)) { return data }
        }
        var data = try await inner.read(key, version: version, range: range)
        if !data.isEmpty {
            let i = data.startIndex + Int(draw() * Double(data.count)) % data.count
            data[i] ^= 0x20
        }
        return data
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition, progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        try await check(.put)
        return try answer(.put, try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition, progress: progress))
    }

    public func copy(from source: String, version: String, to destination: String,
                     metadata: ObjectMetadata?, condition: WriteCondition) async throws -> ObjectInfo {
        try await check(.copy)
        return try answer(.copy, try await inner.copy(from: source, version: version, to: destination, metadata: metadata, condition: condition))
    }

    public func delete(_ key: String, condition: WriteCondition) async throws {
        try await check(.delete)
        try await inner.delete(key, condition: condition)
        try answer(.delete, ())
    }

    public func deleteMoved(_ key: String, version: String, to destination: String) async throws {
        try await check(.delete)
        try await inner.deleteMoved(key, version: version, to: destination)
        try answer(.delete, ())
    }

    public func changes(since cursor: String?, limit: Int) async throws -> ChangeBatch {
        try await check(.changes)
        return try await inner.changes(since: cursor, limit: limit)
    }

    public func currentCursor() async throws -> String { try await check(.changes); return try await inner.currentCursor() }
    public func startingCursor(listingFirst objects: Int) async throws -> String {
        try await check(.changes); return try await inner.startingCursor(listingFirst: objects)
    }
    public func versions(of key: String) async throws -> [ObjectInfo] { try await check(.head); return try await inner.versions(of: key) }
    public func usage() async throws -> StoreUsage? { try await check(.head); return try await inner.usage() }
    public func publishChanges(holdingMoves: Bool) async throws { try await check(.put); try await inner.publishChanges(holdingMoves: holdingMoves) }
}
