import Foundation
import Logging
import Synchronization
import UbiqState

/// What the cache limit asks of the file system, which holds the files: their sizes and use,
/// and evicting one (under its inode table's lock and an `.evict` claim).
public protocol CacheHost: AnyObject, Sendable {
    /// Local content bytes: downloaded files in full, downloads under way as far as they got.
    var localContentBytes: Int64 { get }
    /// The files that could be evicted now (here in full, closed, with nothing waiting to be
    /// written, not pinned), with their size and when each was last used (0: before any file
    /// in memory was); in no order.
    func evictionCandidates() throws -> [CacheCandidate]
    /// Makes `ino` a placeholder again; false, losing nothing, when it must stay (pinned,
    /// not uploaded, opened meanwhile). `waiting` false: the caller holds a claim, so a file
    /// claimed or open now is passed over at once.
    func evict(_ ino: UInt64, waiting: Bool) -> Bool
}

/// A file the cache limit may evict.
public struct CacheCandidate: Sendable, Equatable {
    public var ino: UInt64
    public var size: Int64
    /// When it was last used, in the file system's order of use (0: before any other).
    public var used: UInt64
    public init(ino: UInt64, size: Int64, used: UInt64) { self.ino = ino; self.size = size; self.used = used }
}

/// Keeping local content under the cache limit: least recently used files that are closed,
/// unchanged since their upload and not pinned go back to being placeholders. Nothing else is
/// ever evicted, so the limit can be exceeded by what must stay (open, modified, pinned
/// files). This decides which files and when; the file system (its `CacheHost`) evicts them.
public final class CacheLimit: @unchecked Sendable {
    /// The limit in bytes (nil: none).
    public let limit: Int64?
    private let state: LocalState
    private let logger: Logger
    private weak var host: (any CacheHost)?
    private let checkPending = Mutex<Bool>(false)

    public init(limit: Int64?, state: LocalState, logger: Logger) {
        self.limit = limit; self.state = state; self.logger = logger
    }

    /// The file system whose files are counted and evicted (attached once, by it).
    public func attach(_ host: any CacheHost) { self.host = host }

    /// The order files are evicted in: least recently used first.
    public static func order(_ candidates: [CacheCandidate]) -> [CacheCandidate] {
        candidates.sorted { $0.used < $1.used }
    }

    /// Evicts least recently used files until local content is at most `target` bytes
    /// (default: the limit). Returns the bytes freed. `waiting` false: the caller holds a
    /// claim (a write making room), so files that are claimed or open now are passed over.
    @discardableResult
    public func enforce(target: Int64? = nil, waiting: Bool = true) -> Int64 {
        guard let host, let goal = target ?? limit else { return 0 }
        var usage = host.localContentBytes
        if usage <= goal { return 0 }
        guard let candidates = try? host.evictionCandidates() else { return 0 }
        var freed: Int64 = 0
        for c in Self.order(candidates) where usage > goal {
            guard host.evict(c.ino, waiting: waiting) else { continue }
            usage -= c.size
            freed += c.size
        }
        if freed > 0 { logger.info("cache limit: evicted \(freed) bytes of least recently used files") }
        return freed
    }

    /// Checks the limit off the request path (after a download, an upload, a close), a tenth of
    /// a second later by the state's clock.
    public func scheduleCheck() {
        let pending = checkPending.withLock { p -> Bool in
            defer { p = true }
            return p
        }
        if pending { return }
        state.time.after(0.1, on: .global(), execute: DispatchWorkItem { [weak self] in
            guard let self else { return }
            checkPending.withLock { $0 = false }
            enforce()
            // Space freed since the disk filled up: hold the state database's reserve again.
            state.reserve.restore()
        })
    }
}
