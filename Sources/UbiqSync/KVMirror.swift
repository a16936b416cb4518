import Foundation
import UbiqClock
import Logging
import UbiqState
import UbiqStore

/// A mount's copy of the key-value store, in its state database: reads answer from it, writes
/// go to it first (durable, like a file's close) and then to the store; other devices' changes
/// come in with the change feed. Watchers hear what changed and why.
public final class KVMirror: @unchecked Sendable {
    let state: LocalState
    public let client: KVStoreClient
    let logger: Logger
    private let cond = NSCondition()
    private var watchers: [Int: [KVChange]] = [:]
    private var nextWatcher = 0
    private let pushLock = NSLock()
    /// The user's pause (`ubiq pause`): values set here wait to go, as files do.
    public var pause: SyncPause?

    /// What a watcher hears: the entries that changed, and why ("changed" on another device,
    /// "initial-sync" when the mount first compares with the store).
    public struct KVChange: Sendable {
        public var reason: String
        public var entries: [KVEntry]
    }

    public init(state: LocalState, client: KVStoreClient, logger: Logger) {
        self.state = state; self.client = client; self.logger = logger
    }

    private func local() throws -> [String: (entry: KVEntry, pending: Bool)] {
        var out: [String: (KVEntry, Bool)] = [:]
        for row in try state.read({ try $0.kvAll() }) {
            if let e = KVEntry.decode(row.doc) { out[row.key] = (e, row.pending) }
        }
        return out
    }

    public func get(_ key: String) throws -> KVEntry? {
        try KVLimits.validate(key: key)
        return try state.read { try $0.kvEntry(key) }.flatMap { KVEntry.decode($0.doc) }
    }

    /// Keys with values.
    public func list() throws -> [KVEntry] {
        try local().values.map(\.entry).filter { $0.value != nil }.sorted { $0.key < $1.key }
    }

    /// Records `entry` here (checked against the limits, durable when this returns), then sends
    /// it. Returns what stands: `entry`, or a later one this device already knew.
    @discardableResult
    public func set(_ entry: KVEntry) throws -> KVEntry {
        try KVLimits.validate(key: entry.key)
        let now = try local()
        if let cur = now[entry.key]?.entry, cur.beats(entry) { return cur }
        try KVLimits.check(entry, against: now.mapValues(\.entry))
        try state.write { try $0.kvPut(entry.key, doc: entry.encoded(), pending: true) }
        pushPending()
        return entry
    }

    /// Sends what waits to the store; what fails (offline) waits for the next try.
    public func pushPending() {
        pushLock.lock(); defer { pushLock.unlock() }
        if pause?.isPaused == true { return }
        guard let waiting = try? local().values.filter(\.pending).map(\.entry), !waiting.isEmpty else { return }
        let client = self.client
        for e in waiting {
            do {
                let stands = try runBlocking { try await client.write(e) }
                try state.write { tx in
                    // Changed here meanwhile: the newer stays pending.
                    if let row = try tx.kvEntry(e.key), let cur = KVEntry.decode(row.doc), cur != e, cur.beats(stands) { return }
                    try tx.kvPut(e.key, doc: stands.encoded(), pending: false)
                }
                if stands != e { notify(KVChange(reason: "changed", entries: [stands])) }
            } catch let err as KVError {
                // Over a limit in the store (other devices filled it): kept here, said once.
                logger.warning("key-value store: \(e.key.debugDescription) not sent: \(err)")
                try? state.write { try $0.kvPut(e.key, doc: e.encoded(), pending: false) }
                notify(KVChange(reason: "quota", entries: [e]))
            } catch {
                logger.info("key-value store: \(e.key.debugDescription) waits to be sent (\(error))")
                return
            }
        }
    }

    /// The feed saw these objects change: reads them and keeps what wins. `initial`: the feed
    /// compared everything (the first sync, or after a reset).
    public func apply(objectKeys: [String], initial: Bool) {
        let client = self.client
        var changed: [KVEntry] = []
        for ok in objectKeys {
            guard let key = KVStoreClient.key(fromObjectKey: ok) else { continue }
            guard let remote = try? runBlocking({ try await client.fetch(objectKey: ok) })?.entry, remote.key == key else { continue }
            let took = (try? state.write { tx -> Bool in
                if let row = try tx.kvEntry(key), let cur = KVEntry.decode(row.doc), cur == remote || cur.beats(remote) { return false }
                try tx.kvPut(key, doc: remote.encoded(), pending: false)
                return true
            }) ?? false
            if took, remote.device != client.device { changed.append(remote) }
        }
        if !changed.isEmpty { notify(KVChange(reason: initial ? "initial-sync" : "changed", entries: changed)) }
        pushPending()
    }

    // MARK: watchers

    public func subscribe() -> Int {
        cond.lock(); defer { cond.unlock() }
        nextWatcher += 1
        watchers[nextWatcher] = []
        return nextWatcher
    }

    public func unsubscribe(_ id: Int) {
        cond.lock(); watchers[id] = nil; cond.unlock()
    }

    /// The changes for watcher `id` since its last call, waiting up to `timeout` for one.
    public func next(_ id: Int, timeout: TimeInterval) -> [KVChange] {
        cond.lock(); defer { cond.unlock() }
        let deadline = Deadline(in: timeout)
        while watchers[id]?.isEmpty == true && !deadline.passed { deadline.wait(cond) }
        let out = watchers[id] ?? []
        if watchers[id] != nil { watchers[id] = [] }
        return out
    }

    private func notify(_ c: KVChange) {
        cond.lock()
        for id in watchers.keys { watchers[id]?.append(c) }
        cond.broadcast()
        cond.unlock()
    }
}
