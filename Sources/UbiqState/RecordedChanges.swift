import Foundation
import GRDB
import UbiqClock

// Changes recorded now and written to the database later: a file system request's writes cost
// an append to the intent log, and many requests' changes go to the database in one transaction.
extension LocalState {
    /// Records `changes`, to be applied in order after those recorded before: by the next
    /// transaction or read of this state, or by one made `applyDelay` seconds on. When this
    /// returns they are in the intent log: a killed process loses none of them (`recover`).
    /// A full disk, even after the reserve was given up, is `StateError.full`.
    public func record(_ changes: [StateChange]) throws {
        guard !changes.isEmpty else { return }
        let first = try pending.withLock { p -> Bool in
            let seq = p.nextSeq
            if let intents {
                let bytes = IntentLog.record(seq: seq, changes: changes)
                if var err = intents.append(bytes) {
                    if err == ENOSPC || err == EDQUOT, reserve.release() { err = intents.append(bytes) ?? 0 }
                    if err == ENOSPC || err == EDQUOT { throw StateError.full("intent log: \(String(cString: strerror(err)))") }
                    if err != 0 { throw StateError.database("intent log: \(String(cString: strerror(err)))") }
                }
            }
            p.nextSeq += 1
            p.batches.append((seq, changes))
            return p.batches.count == 1
        }
        if first { scheduleApply(after: applyDelay) }
    }

    /// Whether recorded changes wait for the database.
    public var hasRecorded: Bool { pending.withLock { !$0.batches.isEmpty } }

    /// Applies the recorded changes now.
    public func applyRecordedNow() throws {
        guard hasRecorded else { return }
        try write { _ in }
    }

    func scheduleApply(after delay: TimeInterval) {
        time.after(delay, on: applier, execute: DispatchWorkItem { [weak self] in
            guard let self else { return }
            do { try self.applyRecordedNow() } catch {
                self.report("could not write recorded changes to the state database (kept in its intent log; trying again): \(error)")
                self.scheduleApply(after: 1)
            }
        })
    }

    /// Runs the recorded changes the database lacks (in a transaction, under `writeLock`) and
    /// notes the last one's number with them. Returns that number (nil: there were none).
    func applyRecorded(_ tx: StateTransaction) throws -> UInt64? {
        var done = applied
        guard pending.withLock({ p in p.batches.contains { $0.seq > done } }) else { return nil }
        // What the database says it has, too: another opening of it (a test's device started
        // again beside the old one) may have applied these from the log already.
        done = max(done, try tx.meta(Self.appliedKey).flatMap { UInt64($0) } ?? 0)
        let batches = pending.withLock { p in p.batches.filter { $0.seq > done } }
        guard let last = batches.last?.seq else { return done }
        for b in batches { try apply(b.changes, seq: b.seq, tx) }
        try tx.setMeta(Self.appliedKey, String(last))
        return last
    }

    /// One request's changes. One the database refuses (a constraint: a bug, never a full disk)
    /// is reported and left out, so it cannot hold up every change after it.
    private func apply(_ changes: [StateChange], seq: UInt64, _ tx: StateTransaction) throws {
        for c in changes {
            do { try c.apply(tx) } catch let e as DatabaseError where e.resultCode == .SQLITE_CONSTRAINT {
                report("a recorded change (\(seq)) was refused by the state database and left out: \(c): \(e)")
            }
        }
    }

    /// After the transaction that applied them committed (under `writeLock`).
    func markApplied(_ last: UInt64) {
        applied = last
        pending.withLock { p in
            p.batches.removeAll { $0.seq <= last }
            // Start the log again before it grows, with only what is not in the database.
            if let intents, intents.size > intentLogLimit {
                if p.batches.isEmpty { intents.truncate() } else { intents.rewrite(p.batches) }
            }
        }
    }

    static let appliedKey = "intent_seq"

    /// At open: applies what the intent log holds and the database does not, then empties the
    /// log. Records must follow the database's last applied one without a gap; after a gap
    /// (a power loss took the end of the WAL but not of the log) the rest is not applied, as it
    /// was written on a state that is gone, and what was only closed since the last fsync is
    /// lost, as the power-loss contract allows.
    func recover() throws {
        guard let intents else { return }
        let records = intents.readAll()
        writeLock.lock(); defer { writeLock.unlock() }
        let done = try dbQueue.read { db in try StateTransaction(db: db, now: self.time.now).meta(Self.appliedKey) }.flatMap { UInt64($0) } ?? 0
        var todo: [(seq: UInt64, changes: [StateChange])] = []
        var next = done + 1
        for r in records where r.seq > done {
            guard r.seq == next else {
                report("the state's intent log skips from change \(next - 1) to \(r.seq) (a power loss?): \(records.filter { $0.seq >= r.seq }.count) recorded requests left out")
                break
            }
            todo.append(r)
            next += 1
        }
        if !todo.isEmpty {
            let replay = {
                try self.dbQueue.write { db in
                    let tx = StateTransaction(db: db, now: self.time.now)
                    for r in todo { try self.apply(r.changes, seq: r.seq, tx) }
                    try tx.setMeta(Self.appliedKey, String(next - 1))
                }
            }
            do { try replay() } catch let e as DatabaseError where e.resultCode == .SQLITE_FULL && reserve.release() {
                do { try replay() } catch { throw StateError.full("cannot apply the intent log \(intents.path): \(error)") }
            } catch {
                throw StateError.database("cannot apply the intent log \(intents.path): \(error)")
            }
        }
        applied = next - 1
        pending.withLock { $0.nextSeq = next }
        intents.truncate()
    }
}
