import Foundation
import UbiqClock

/// What a claimant means to do with an item. Like `NSFileCoordinator`'s
/// reading/writing options: the intent decides whether a claim shares the
/// item with others or excludes them.
public enum Intent: String, Sendable, CaseIterable {
    /// Reading content or attributes. Shared.
    case read
    /// Snapshotting content for an upload. Shared with readers, excludes writers.
    case upload
    /// Changing content or attributes. Exclusive.
    case write
    /// Removing the item. Exclusive.
    case delete
    /// Moving the item (claimed on source and destination). Exclusive.
    case move
    /// Replacing the item's content wholesale (remote update, download). Exclusive.
    case replace
    /// Filling in content that was not local. Exclusive.
    case download
    /// Dropping local content. Exclusive.
    case evict

    public var isShared: Bool { self == .read || self == .upload }
}

public enum CoordinatorError: Error, Equatable, CustomStringConvertible {
    /// The claim could not be had before its deadline; nothing is held.
    case timedOut(item: UInt64, intent: Intent)

    public var description: String {
        switch self {
        case let .timedOut(item, intent):
            return "timed out waiting to claim item \(item) for \(intent.rawValue)"
        }
    }
}

/// A set of items held with one intent. Release it exactly once
/// (`Coordinator.release`), or use `Coordinator.withClaim`.
public struct Claim: Sendable {
    public let items: [UInt64]
    public let intent: Intent
}

/// Per-item reader/writer coordination with intents.
///
/// Every access to an item — a FUSE operation, an upload snapshot, a download,
/// an eviction, a remote update — claims the item first. Shared intents
/// (`read`, `upload`) coexist; every other intent excludes all others.
///
/// LOCK ORDERING: a multi-item claim (a move claims source and destination)
/// takes its items one at a time in ascending item id. Since every claimant
/// waits only for an item greater than all items it holds, no cycle of waits
/// can form, so claims never deadlock.
///
/// FAIRNESS: an exclusive claimant that is waiting blocks new shared claims of
/// that item, so a stream of readers cannot starve a writer; waiters of one
/// kind are woken together, and a deadline bounds every wait.
public final class Coordinator: @unchecked Sendable {
    // Guarded by `condition`: the state of every item currently claimed or waited on.
    private struct ItemState {
        var readers = 0
        var writer = false
        var waitingWriters = 0
        var isIdle: Bool { readers == 0 && !writer && waitingWriters == 0 }
    }

    private let condition = NSCondition()
    private var items: [UInt64: ItemState] = [:]
    /// Claimants waiting now (guarded by `condition`).
    private var waiting = 0
    /// How long a claim waits by default before failing.
    public let defaultTimeout: TimeInterval
    /// The clock deadlines go by (a test's `ManualTime`: a claim gives up when the test says).
    let time: any TimeSource

    public init(defaultTimeout: TimeInterval = 30, time: any TimeSource = SystemTime()) {
        self.defaultTimeout = defaultTimeout
        self.time = time
    }

    /// Claims `items` with `intent`, waiting up to `timeout` seconds in all.
    /// Duplicates are claimed once. Throws `CoordinatorError.timedOut`
    /// holding nothing if the deadline passes.
    public func claim(_ items: [UInt64], _ intent: Intent, timeout: TimeInterval? = nil) throws -> Claim {
        let ordered = Array(Set(items)).sorted()
        let deadline = time.now.addingTimeInterval(timeout ?? defaultTimeout)
        condition.lock()
        defer { condition.unlock() }
        var held: [UInt64] = []
        for item in ordered {
            if !acquireLocked(item, intent, deadline: deadline) {
                for h in held { releaseLocked(h, intent) }
                condition.broadcast()
                throw CoordinatorError.timedOut(item: item, intent: intent)
            }
            held.append(item)
        }
        return Claim(items: ordered, intent: intent)
    }

    public func claim(_ item: UInt64, _ intent: Intent, timeout: TimeInterval? = nil) throws -> Claim {
        try claim([item], intent, timeout: timeout)
    }

    public func release(_ claim: Claim) {
        condition.lock()
        for item in claim.items { releaseLocked(item, claim.intent) }
        condition.broadcast()
        condition.unlock()
    }

    public func withClaim<T>(_ items: [UInt64], _ intent: Intent, timeout: TimeInterval? = nil,
                             _ body: () throws -> T) throws -> T {
        let c = try claim(items, intent, timeout: timeout)
        defer { release(c) }
        return try body()
    }

    public func withClaim<T>(_ item: UInt64, _ intent: Intent, timeout: TimeInterval? = nil,
                             _ body: () throws -> T) throws -> T {
        try withClaim([item], intent, timeout: timeout, body)
    }

    /// Number of items with any holder or waiter (for tests and status).
    public var activeItemCount: Int {
        condition.lock(); defer { condition.unlock() }
        return items.count
    }

    /// Number of claims waiting now (for tests and status).
    public var waitingClaimCount: Int {
        condition.lock(); defer { condition.unlock() }
        return waiting
    }

    /// Waits for a change, or until `deadline` by the clock; false when it has passed.
    private func waitLocked(until deadline: Date) -> Bool {
        waiting += 1
        defer { waiting -= 1 }
        return time.wait(condition, until: deadline) || time.now < deadline
    }

    // MARK: - Under `condition`

    private func acquireLocked(_ item: UInt64, _ intent: Intent, deadline: Date) -> Bool {
        if intent.isShared {
            while true {
                let s = items[item, default: ItemState()]
                if !s.writer && s.waitingWriters == 0 {
                    items[item, default: ItemState()].readers += 1
                    return true
                }
                if !waitLocked(until: deadline) {
                    dropIfIdle(item)
                    return false
                }
            }
        } else {
            items[item, default: ItemState()].waitingWriters += 1
            while true {
                let s = items[item]!
                if !s.writer && s.readers == 0 {
                    items[item]!.waitingWriters -= 1
                    items[item]!.writer = true
                    return true
                }
                if !waitLocked(until: deadline) {
                    items[item]!.waitingWriters -= 1
                    dropIfIdle(item)
                    // Readers held back by this waiter may go now.
                    condition.broadcast()
                    return false
                }
            }
        }
    }

    private func releaseLocked(_ item: UInt64, _ intent: Intent) {
        guard var s = items[item] else { preconditionFailure("release of unclaimed item \(item)") }
        if intent.isShared {
            precondition(s.readers > 0, "shared release without a shared claim on \(item)")
            s.readers -= 1
        } else {
            precondition(s.writer, "exclusive release without an exclusive claim on \(item)")
            s.writer = false
        }
        items[item] = s
        dropIfIdle(item)
    }

    private func dropIfIdle(_ item: UInt64) {
        if let s = items[item], s.isIdle { items[item] = nil }
    }
}
