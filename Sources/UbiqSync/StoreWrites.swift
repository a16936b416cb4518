import Foundation
import Synchronization
import UbiqStore

/// Which keys this device wrote (or deleted) in the store, and when, in one count of writes:
/// what a question to the store answered is stale for a key written here since it was asked.
///
/// The change feed asks the store (a listing, the change log and its HEADs) and applies the
/// answers a moment later; meanwhile the uploader may write the keys it asked of. For a key an
/// item records, the recorded version tells (`RemoteChange.recordedBefore`); for a key this
/// device deleted (a tombstone made and gone meanwhile) nothing did, and a listing taken just
/// before the delete brought the item back as new: a folder renamed away came back at its old
/// name, empty (2026-12-07, `scripts/crash-loop`). So every write is noted before it is sent
/// and again once it is answered, and a change asked before either is looked at again at the
/// next poll: `asked()` before the question, `writtenSince` after reading what this device
/// records of the key.
public final class StoreWrites: Sendable {
    private struct Ledger {
        var count: UInt64 = 0
        /// The count at each key's last note, while a question from before it may be open.
        var last: [KeyBytes: UInt64] = [:]
        /// The counts questions open now were asked at (a count may be open more than once).
        var open: [UInt64: Int] = [:]
    }

    private let ledger = Mutex(Ledger())

    public init() {}

    /// A question to the store about to be asked; `done` when its answers are applied.
    public struct Question: Sendable {
        public let at: UInt64
    }

    public func asked() -> Question {
        ledger.withLock { l in
            l.open[l.count, default: 0] += 1
            return Question(at: l.count)
        }
    }

    public func done(_ q: Question) {
        ledger.withLock { l in
            if let n = l.open[q.at], n > 1 { l.open[q.at] = n - 1 } else { l.open[q.at] = nil }
            // What no open question was asked before is no longer needed.
            guard let oldest = l.open.keys.min() else { return l.last.removeAll() }
            if l.last.count > 4096 { l.last = l.last.filter { $0.value > oldest } }
        }
    }

    /// Notes a write of `keys` (before it is sent, and again once it is answered).
    public func note(_ keys: [String]) {
        ledger.withLock { l in
            l.count += 1
            guard !l.open.isEmpty else { return }
            for k in keys { l.last[KeyBytes(k)] = l.count }
        }
    }

    /// Whether this device wrote `key` after `q` was asked: what the store said of it then may be
    /// older than what this device did. Call after reading what this device records of `key`.
    public func writtenSince(_ q: UInt64, _ key: String) -> Bool {
        ledger.withLock { l in (l.last[KeyBytes(key)] ?? 0) > q }
    }

    /// Runs the write `body` of `keys`, noted before and after (also when it fails: a write
    /// whose answer was lost may have been made).
    public func writing<T>(_ keys: String..., body: () async throws -> T) async rethrows -> T {
        note(keys)
        defer { note(keys) }
        return try await body()
    }
}
