import Foundation
import UbiqState
import UbiqSync

/// What the cache limit (`CacheLimit`, the sync engine's) counts and evicts: the files here in
/// full, under the inode table's lock.
extension FileSystem: CacheHost {
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

    /// From the rows (files not in memory are closed and committed); those in memory as they
    /// are there.
    public func evictionCandidates() throws -> [CacheCandidate] {
        let stored = try state.read { tx in try tx.presentFiles(unpinned: true) }
        return inodes.locked { t in
            stored.compactMap { f in
                guard let n = t.resident(f.ino) else { return CacheCandidate(ino: f.ino, size: f.size, used: 0) }
                guard n.isRegular && n.rec.present && n.opens == 0 && !n.unpersisted && !n.rec.pinned else { return nil }
                return CacheCandidate(ino: f.ino, size: n.rec.size, used: n.lastUsed)
            }
        }
    }

    /// `evictFile` refuses, losing nothing, whatever must stay.
    public func evict(_ ino: UInt64, waiting: Bool) -> Bool {
        (try? evictFile(ino, waiting: waiting)) != nil
    }
}
