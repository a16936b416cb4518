import Foundation
import UbiqClock
import Synchronization
import Logging
import UbiqCoordinator
import UbiqState
import UbiqStore

// One round of the outbox: what is due, each item uploaded under its claim, the outcome
// recorded; tombstones; pausing when the state database cannot record outcomes.
extension Uploader {
    /// `setAside`: uploaded, after keeping the store's other version as a conflict copy.
    /// `localOnly`: kept on this device only by design (a name the store cannot hold): no error.
    /// `busy`: still being written here (it goes once the writer is done); `deferred`: sent back
    /// to the queue to go again at once.
    enum Outcome { case done, retry(String), busy, deferred, setAside(String), conflict(String), permanent(String), localOnly(String) }

    /// Processes what is due; returns how many items were handled.
    @discardableResult
    public func processRound(ignoringDelay: Bool) -> Int {
        // Paused by the user: this device's changes wait (`SyncPause`).
        if pause?.isPaused == true { return 0 }
        var handled = 0
        let asOf: Date? = ignoringDelay ? .distantFuture : nil  // nil: the state's time
        // A move under way waits for the rounds that follow at once (docs/s3.md).
        defer { if handled > 0 { publishChanges(holdingMoves: moreDue(asOf: asOf)) } }
        let now = state.time.now
        cond.lock(); let paused = now < pausedUntil; cond.unlock()
        if paused { return 0 }
        // Deletes first: a key freed by a delete may be taken by a new upload.
        let graves = (try? state.read { try $0.tombstones(limit: 256) }) ?? []
        for t in graves {
            do {
                if t.isLeftover {
                    // Where an upload went whose answer never came, from an item removed since:
                    // deleted if it is there and no item here records it.
                    _ = try deleteUnrecordedOfOurs(t.key, why: "tombstone for an unanswered upload")
                    guard recordDone(tombstone: t.id) else { return handled }
                    handled += 1
                    continue
                }
                try deleteNoLongerNamed(t.key, version: t.version, why: "tombstone")
            } catch StoreError.notFound {
                // The unanswered upload is not there: nothing to delete.
            } catch StoreError.preconditionFailed {
                logger.info("not deleting \(t.key): it changed in the store")
            } catch {
                logger.warning("delete of \(t.key) failed, will retry: \(error)")
                return handled
            }
            guard recordDone(tombstone: t.id) else { return handled }
            keepFolderEmptied(by: t.key)
            handled += 1
        }
        let due = (try? state.read { try $0.dueOutbox(limit: 64, asOf: asOf) }) ?? []
        handled += uploadSideBySide(due)
        return handled
    }

    /// Uploads one item of the outbox and records the outcome; false when that could not be
    /// recorded (the round stops, paused). `keys`: the keys it was let go with beside others
    /// (`uploadSideBySide`); nil when it goes alone.
    func uploadAndRecord(_ item: StateTransaction.OutboxItem, keys: Set<KeyBytes>?) -> Bool {
        let outcome: Outcome
        var diskFull = false
        // The percent under way is kept until the outcome is recorded: cleared before, a status
        // read in between saw the item still queued with no percent, so 0.
        defer { progress.set(item.ino, nil) }
        if uploadHost?.isOpenForWriting(item.ino) ?? false {
            outcome = .busy
        } else {
            do { outcome = try upload(item.ino, keys: keys) } catch let e as StoreError where e.isTransient {
                outcome = .retry("\(e)")
            } catch StoreError.quotaExceeded(let key) {
                // Kept here and tried again: space may free up in the store.
                outcome = .retry("store quota exceeded writing \(key)")
            } catch let e as StoreError {
                outcome = .permanent("\(e)")
            } catch let e as StateError {
                // This device's disk, not the store: tried again soon, as space may free up.
                if case .full = e { diskFull = true }
                outcome = .retry("\(e)")
            } catch {
                outcome = .retry("\(error)")
            }
        }
        do {
            try state.write { tx in
                switch outcome {
                case .done, .setAside:
                    try tx.completeOutbox(item.ino, seq: item.seq)
                case .busy:
                    // Not tried: a file open for long does not make its later tries back off.
                    try tx.retryOutbox(item.ino, after: 0.5, attempt: false)
                case .deferred:
                    // Sent back again and again (a store that refuses what it just said it has):
                    // backs off as a failure does, rather than asking the store twice a second.
                    try tx.retryOutbox(item.ino, after: SyncRetries.sentBack.pause(afterFailures: item.attempts + 1))
                case .retry(let why):
                    try tx.setUploadError(item.ino, why)
                    try tx.retryOutbox(item.ino, after: diskFull ? 2 : SyncRetries.upload.pause(afterFailures: item.attempts + 1))
                case .conflict(let why):
                    try tx.setUploadError(item.ino, why, conflict: true)
                    try tx.completeOutbox(item.ino, seq: item.seq)
                case .permanent(let why):
                    try tx.setUploadError(item.ino, why)
                    try tx.completeOutbox(item.ino, seq: item.seq)
                case .localOnly(let why):
                    try tx.setUploadError(item.ino, why, localOnly: true)
                    try tx.completeOutbox(item.ino, seq: item.seq)
                }
            }
            cond.lock(); let said = pauseSaid; pauseSaid = false; cond.unlock()
            if said { logger.notice("uploads go on: outcomes are recorded again") }
        } catch {
            // Not recorded: the item stays due. Pause rather than send it again at once.
            pause(because: "outbox update failed: \(error)")
            return false
        }
        switch outcome {
        case .done, .permanent, .retry, .localOnly: uploadHost?.uploadEnded(item.ino, conflict: false, copyMade: false)
        case .conflict: uploadHost?.uploadEnded(item.ino, conflict: true, copyMade: false)
        case .setAside: uploadHost?.uploadEnded(item.ino, conflict: false, copyMade: true)
        case .busy, .deferred: break
        }
        cond.lock()
        if case .deferred = outcome { requeued += 1 }
        let sayRetry: Bool
        if case .retry(let why) = outcome {
            sayRetry = retrySaid[item.ino] != why
            retrySaid[item.ino] = why
        } else {
            sayRetry = false
            switch outcome {
            case .busy, .deferred: break
            default: retrySaid[item.ino] = nil
            }
        }
        cond.unlock()
        switch outcome {
        case .retry(let why): if sayRetry { logger.warning("upload of inode \(item.ino) failed, will retry (said once while the reason stays): \(why)") }
        case .setAside(let copy): logger.notice("upload of inode \(item.ino): the store had another device's version; kept it as \(copy)")
        case .conflict(let why), .permanent(let why): logger.error("upload of inode \(item.ino): \(why)")
        case .localOnly(let why): logger.info("\(why)")
        default: break
        }
        return true
    }

    /// Makes the round's writes visible to other devices' feeds (the S3 store's change log).
    /// Not done now (the store is down): they go with the next round's, and until then other
    /// devices find them by listing the store.
    func publishChanges(holdingMoves: Bool = false) {
        let store = self.store
        do { try runBlocking { try await store.publishChanges(holdingMoves: holdingMoves) } } catch {
            logger.info("the store's change log: could not write this round's changes yet: \(error)")
        }
    }

    /// Whether the outbox has more due at once (a round follows this one without a pause).
    func moreDue(asOf: Date?) -> Bool {
        let items = (try? state.read { try $0.dueOutbox(limit: 1, asOf: asOf) }) ?? []
        let graves = (try? state.read { try $0.tombstones(limit: 1) }) ?? []
        return !items.isEmpty || !graves.isEmpty
    }

    /// Removes a tombstone whose delete was done; false (and a pause) when that could not be
    /// recorded.
    func recordDone(tombstone id: Int64) -> Bool {
        do {
            try state.write { try $0.removeTombstone(id) }
            return true
        } catch {
            pause(because: "tombstone update failed: \(error)")
            return false
        }
    }

    /// Pauses uploads 2 s: the state database could not record what was done (a full disk).
    /// Said once, until outcomes are recorded again.
    func pause(because why: String) {
        cond.lock()
        pausedUntil = state.time.now + 2
        let said = pauseSaid
        pauseSaid = true
        cond.unlock()
        if !said { logger.error("\(why); uploads pause, and are tried again every 2 s") }
    }

    struct Snapshot {
        var rec: InodeRecord
        var upload: UploadState
        var entries: [(EntryRecord, String?)]
        var xattrs: [[UInt8]: [UInt8]]
    }

    func snapshot(_ ino: UInt64) throws -> Snapshot? {
        try state.read { tx in
            guard let rec = try tx.inode(ino), let up = try tx.uploadState(ino) else { return nil }
            let entries = try tx.entries(of: ino).map { ($0, try Self.path(of: $0, tx)) }
            return Snapshot(rec: rec, upload: up, entries: entries, xattrs: try tx.xattrs(ino))
        }
    }

    /// The store key of an entry (nil when a name is not valid UTF-8 or the entry is detached).
    static func path(of entry: EntryRecord, _ tx: StateTransaction) throws -> String? {
        var names = [entry.name]
        var parent = entry.parent
        var depth = 0
        while parent != 1 {
            guard let up = try tx.entries(of: parent).first, depth < 4096 else { return nil }
            names.append(up.name)
            parent = up.parent
            depth += 1
        }
        var parts: [String] = []
        for n in names.reversed() {
            guard let s = String(validating: n, as: UTF8.self) else { return nil }
            parts.append(s)
        }
        return parts.joined(separator: "/")
    }
}
