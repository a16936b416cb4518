import Foundation
import UbiqClock
import UbiqState

/// Keeping local content under the cache limit: least recently used files
/// that are closed, unchanged since their upload and not pinned go back to
/// being placeholders. Nothing else is ever evicted, so the limit can be
/// exceeded by what must stay (open, modified, pinned files).
extension FileSystem {
    /// Local content bytes: downloaded files in full, downloads under way as far as they got.
    /// (No walk over every inode: the check runs every tenth of a second while files are
    /// written, under the inode table's lock.)
    public var localContentBytes: Int64 {
        inodes.locked { t in
            materializer.downloadedSoFar().reduce(t.presentBytes) { sum, d in
                sum + (t[d.ino].map { $0.isRegular && !$0.rec.present } == true ? d.bytes : 0)
            }
        }
    }

    /// The running count of present files' bytes, and the same summed over every inode (those
    /// in memory as they are there, the others from their rows), taken under one lock (what
    /// tests compare).
    var presentBytesBothWays: (kept: Int64, walked: Int64) {
        get throws {
            try inodes.locked { t in
                let stored = try state.read { tx in try tx.presentFiles() }
                let inMemory = t.residents.reduce(Int64(0)) { $0 + Node.localBytes($1.rec) }
                return (t.presentBytes, stored.reduce(inMemory) { sum, f in t.resident(f.ino) == nil ? sum + f.size : sum })
            }
        }
    }

    /// Evicts least recently used files until local content is at most `target` bytes
    /// (default: the cache limit). Returns the bytes freed. `waiting` false: the caller holds a
    /// claim (a write making room), so files that are claimed or open now are passed over.
    @discardableResult
    public func enforceCacheLimit(target: Int64? = nil, waiting: Bool = true) -> Int64 {
        guard let limit = target ?? cacheLimit else { return 0 }
        var usage = localContentBytes
        if usage <= limit { return 0 }
        // From the rows (files not in memory are closed and committed), least recently used
        // first: those not in memory count as used before any that is.
        guard let stored = try? state.read({ tx in try tx.presentFiles(unpinned: true) }) else { return 0 }
        let candidates = inodes.locked { t in
            stored.compactMap { f -> (ino: UInt64, size: Int64, used: UInt64)? in
                guard let n = t.resident(f.ino) else { return (f.ino, f.size, 0) }
                guard n.isRegular && n.rec.present && n.opens == 0 && !n.unpersisted && !n.rec.pinned else { return nil }
                return (f.ino, n.rec.size, n.lastUsed)
            }
            .sorted { $0.used < $1.used }
        }
        var freed: Int64 = 0
        for (ino, size, _) in candidates where usage > limit {
            // evictFile refuses, losing nothing, whatever must stay (pinned folder, not uploaded, opened meanwhile).
            guard (try? evictFile(ino, waiting: waiting)) != nil else { continue }
            usage -= size
            freed += size
        }
        if freed > 0 { logger.info("cache limit: evicted \(freed) bytes of least recently used files") }
        return freed
    }

    /// Checks the limit off the request path (after a download, an upload, a close), a tenth of
    /// a second later by the state's clock.
    func scheduleCacheLimitCheck() {
        let pending = limitCheckPending.withLock { p -> Bool in
            defer { p = true }
            return p
        }
        if pending { return }
        state.time.after(0.1, on: .global(), execute: DispatchWorkItem { [weak self] in
            self?.limitCheckPending.withLock { $0 = false }
            self?.enforceCacheLimit()
            // Space freed since the disk filled up: hold the state database's reserve again.
            self?.state.reserve.restore()
        })
    }
}
