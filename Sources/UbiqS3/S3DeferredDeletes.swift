import Foundation
import UbiqStore

/// The deletes a move implies, made only when the log takes the move (docs/s3.md): the delete
/// of a key a move copied elsewhere (`S3Store.deleteMoved`) waits in the device (and in its
/// index, for a crash) and is made just before the log object that tells of the move. While a
/// folder's move goes on over many rounds and its log entries wait
/// (`ChangeLog.publish(holdingMoves:)`), another device, which still has the folder where it
/// was, reads the files it has not downloaded at their old keys; once it reads the move, the
/// old keys are gone, as the log says.
///
/// Until then, this device sees the store as if each delete were made: anything else it does
/// with such a key (a write, a HEAD, another delete) makes that delete first, and its listings
/// leave the key out.
final class S3DeferredDeletes: @unchecked Sendable {
    /// What became of a delete made.
    enum Outcome: Sendable {
        case deleted
        /// The key holds another version now (another device wrote it): it stays.
        case refused
        /// It could not be made (the store): it waits on.
        case failed
    }

    private enum State {
        /// The version it may delete.
        case waiting(String)
        /// Being made; those who wait for its outcome.
        case running(String, [CheckedContinuation<Outcome, Never>])
    }

    private let objects: S3Objects
    private let index: S3Index
    private let lock = NSLock()
    private var state: [String: State] = [:]
    /// What became of the deletes made (when the log asked, or earlier: something else needed
    /// the key, or an earlier log object went first), until the log takes their entries.
    private var outcomes: [String: Outcome] = [:]
    /// Deletes made at once when the log asks for many.
    static let inFlight = 16

    init(objects: S3Objects, index: S3Index) {
        self.objects = objects; self.index = index
        // Those a run before this one deferred and did not make (it ended before the log object).
        for d in index.deferred() { state[d.key] = .waiting(d.version) }
    }

    /// The keys whose delete waits, as the index had them at the start.
    var waitingKeys: Set<String> { lock.withLock { Set(state.keys) } }

    /// Defers the delete of `version` of `key`; whether it did (noted in the index first: if it
    /// cannot be, the caller deletes at once). Call after `settle(key)`.
    func deferDelete(_ key: String, version: String) -> Bool {
        guard index.noteDeferred(key: key, version: version) else { return false }
        lock.withLock { state[key] = .waiting(version) }
        return true
    }

    /// `infos` without the keys whose delete waits: a listing shows the store as if each were made.
    func leavingOutWaiting(_ infos: [ObjectInfo]) -> [ObjectInfo] {
        lock.withLock { state.isEmpty ? infos : infos.filter { state[$0.key] == nil } }
    }

    /// Makes the delete of `key` that waits, if one does (or waits for the one being made);
    /// its outcome, nil if none waited. Throws when it could not be made (it waits on).
    @discardableResult
    func settle(_ key: String) async throws -> Outcome? {
        enum Role { case none, make(String), wait }
        let role: Role = lock.withLock {
            switch state[key] {
            case nil: return .none
            case .waiting(let version):
                state[key] = .running(version, [])
                return .make(version)
            case .running: return .wait
            }
        }
        switch role {
        case .none: return nil
        case .make(let version): return try await make(key, version: version)
        case .wait:
            let outcome: Outcome = await withCheckedContinuation { c in
                let now: Outcome? = lock.withLock {
                    switch state[key] {
                    case .running(let v, var waiters):
                        waiters.append(c)
                        state[key] = .running(v, waiters)
                        return nil
                    case .waiting: return .failed  // made meanwhile, and it failed
                    case nil: return outcomes[key] ?? .deleted
                    }
                }
                if let now { c.resume(returning: now) }
            }
            if outcome == .failed { throw StoreError.failed("the delete of \(key) could not be made") }
            return outcome
        }
    }

    private func make(_ key: String, version: String) async throws -> Outcome {
        var outcome = Outcome.deleted
        var failure: Error?
        do {
            try await objects.delete(key, condition: .ifMatch(version))
        } catch StoreError.notFound {
        } catch StoreError.preconditionFailed {
            outcome = .refused
        } catch {
            outcome = .failed
            failure = error
        }
        if outcome != .failed { index.forgetDeferred(key: key) }
        let waiters: [CheckedContinuation<Outcome, Never>] = lock.withLock {
            guard case .running(_, let waiters) = state[key] else { return [] }
            if outcome == .failed {
                state[key] = .waiting(version)
            } else {
                state[key] = nil
                outcomes[key] = outcome
            }
            return waiters
        }
        for w in waiters { w.resume(returning: outcome) }
        if let failure { throw failure }
        return outcome
    }

    /// For the log, before the log object that holds their entries: makes the deletes that
    /// wait of `keys` and of `ahead` (those of the log objects that follow it: a folder's move
    /// split over several log objects has its old keys gone before the first), `inFlight` at
    /// once; returns those of `keys` that were refused, made early or now. Folder markers go
    /// after the files, the deepest first: deleted while its folder held something, a marker
    /// leaves SeaweedFS's directory of it, which answers other devices' HEADs, until the
    /// folder empties.
    func settleForLog(_ keys: [String], ahead: [String] = []) async throws -> Set<String> {
        let all = keys + ahead
        let depth = { (k: String) in k.utf8.reduce(0) { $0 + ($1 == 0x2F ? 1 : 0) } }
        let markers = Dictionary(grouping: all.filter { $0.hasSuffix("/") }, by: depth)
        try await settleAtOnce(all.filter { !$0.hasSuffix("/") })
        for d in markers.keys.sorted(by: >) { try await settleAtOnce(markers[d]!) }
        return lock.withLock {
            Set(keys.filter { outcomes.removeValue(forKey: $0) == .refused })
        }
    }

    /// Makes the deletes that wait of `keys`, `inFlight` at once.
    private func settleAtOnce(_ keys: [String]) async throws {
        guard !keys.isEmpty else { return }
        try await withThrowingTaskGroup(of: Void.self) { group in
            var next = keys.makeIterator()
            func add() {
                guard let key = next.next() else { return }
                group.addTask { try await self.settle(key) }
            }
            for _ in 0 ..< Self.inFlight { add() }
            while try await group.next() != nil { add() }
        }
    }
}
