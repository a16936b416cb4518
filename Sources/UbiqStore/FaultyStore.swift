import Foundation
import Synchronization

/// Wraps a store and makes chosen operations fail, to test what the device does
/// when the store is down or answers wrongly. Faults are switched on and off while
/// it runs.
public final class FaultyStore: CloudStore, Sendable {
    public enum Operation: Sendable, Hashable { case head, list, read, put, copy, delete, changes }

    public let inner: any CloudStore
    public var keepsPriorVersions: Bool { inner.keepsPriorVersions }
    private let failing = Mutex<[Operation: StoreError]>([:])
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

    public init(_ inner: any CloudStore, offlineFlag: String? = nil) { self.inner = inner; self.offlineFlag = offlineFlag }

    /// From now on `op` fails with `error` (default: the store is unavailable).
    public func fail(_ op: Operation, with error: StoreError = .unavailable("injected fault")) {
        failing.withLock { $0[op] = error }
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

    private func check(_ op: Operation) throws {
        if let flag = offlineFlag, access(flag, F_OK) == 0 { throw StoreError.unavailable("offline (\(flag) exists)") }
        if let e = failing.withLock({ $0[op] }) { throw e }
    }

    private func answer<T>(_ op: Operation, _ value: T) throws -> T {
        if losing.withLock({ $0.contains(op) }) { throw StoreError.unavailable("injected fault: the answer was lost") }
        return value
    }

    public func head(_ key: String) async throws -> ObjectInfo { try check(.head); return try await inner.head(key) }

    public func list(prefix: String) async throws -> [ObjectInfo] {
        try check(.list)
        return try await inner.list(prefix: prefix)
    }

    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        try check(.read)
        try held.withLock({ $0[range.lowerBound] })?.pass()
        return try await inner.read(key, version: version, range: range)
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition) async throws -> ObjectInfo {
        try check(.put)
        return try answer(.put, try await inner.put(key, contentsOf: source, metadata: metadata, condition: condition))
    }

    public func copy(from source: String, version: String, to destination: String,
                     metadata: ObjectMetadata?, condition: WriteCondition) async throws -> ObjectInfo {
        try check(.copy)
        return try answer(.copy, try await inner.copy(from: source, version: version, to: destination, metadata: metadata, condition: condition))
    }

    public func delete(_ key: String, condition: WriteCondition) async throws {
        try check(.delete)
        try await inner.delete(key, condition: condition)
        try answer(.delete, ())
    }

    public func changes(since cursor: String?, limit: Int) async throws -> ChangeBatch {
        try check(.changes)
        return try await inner.changes(since: cursor, limit: limit)
    }

    public func currentCursor() async throws -> String { try check(.changes); return try await inner.currentCursor() }
    public func versions(of key: String) async throws -> [ObjectInfo] { try check(.head); return try await inner.versions(of: key) }
    public func usage() async throws -> StoreUsage? { try check(.head); return try await inner.usage() }
}
