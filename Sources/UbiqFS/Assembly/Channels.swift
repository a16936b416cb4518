import Foundation
import UbiqSync

// The file system's back-channels: what it tells the kernel and asks of the change feed, and
// what it is to the sync engine's parts (`UploadHost`, `ContentSink`, `StoreItemHost` in
// UbiqSync). `Engine` and the FUSE binding attach them; each is held weakly.

/// What the file system tells the kernel: drop what it cached (the FUSE binding is it).
public protocol KernelNotifier: AnyObject, Sendable {
    /// Drops the kernel's cached pages and attributes of `ino` (`pages` false: the attributes only).
    func invalidateInode(_ ino: UInt64, pages: Bool)
    /// Makes the kernel forget `name` in the folder `parent`.
    func invalidateEntry(_ parent: UInt64, _ name: [UInt8])
    /// Folder `ino`'s mode or owner changed (here or on another device): who checks search
    /// permission as names are looked up has the kernel forget the names it holds there, which
    /// it would otherwise walk through unchecked. Called before the change is answered.
    func folderAccessChanged(_ ino: UInt64)
}

extension KernelNotifier {
    /// A kernel that checks permissions itself needs nothing.
    public func folderAccessChanged(_ ino: UInt64) {}
}

/// What the file system asks of the change feed.
public protocol StoreFeed: AnyObject, Sendable {
    /// Looks at the store's changes now; how many it found. `everywhere` (`ubiq sync --full`): also
    /// what changed in the store without its feed knowing (another tool's objects in a bucket).
    @discardableResult func poll(everywhere: Bool) throws -> Int
    /// Asks for a poll soon: a remote update waited for a file's readers, an upload made a
    /// conflict copy that should arrive here (`everywhere`: as `poll`'s, a version read here
    /// is gone from the store).
    func kick(everywhere: Bool)
    /// Runs `look` after each poll until it says it is done, and at the latest `seconds` on
    /// (`look(true)`), polling often meanwhile (a read whose version a move elsewhere took).
    func afterEachPoll(for seconds: TimeInterval, everywhereAfter: TimeInterval, _ look: @escaping @Sendable (_ last: Bool) -> Bool)
    /// What it last saw of the store (the root's `store-*` attributes).
    var look: ChangeFeed.Look { get }
    /// Whether the store answers now (one request, its own retries only).
    func storeAnswers() -> Bool
    /// Whether the listing that brings in a new device's rest of the store is under way, whether
    /// it may still bring store key `key` (bytes), and a wait for it (`FileSystem.notListedYet`).
    var fillingIn: Bool { get }
    func mayStillBring(_ key: [UInt8]) -> Bool
    func waitForTheListing(toBring key: [UInt8], seconds: TimeInterval)
}

extension ChangeFeed: StoreFeed {}

extension FileSystem: UploadHost, ContentSink {
    public func uploadEnded(_ ino: UInt64, conflict: Bool, copyMade: Bool) {
        // A copy made is announced, with both names, when it arrives (`announceIfConflictCopy`).
        emit(conflict ? .conflict : .status, ino)
        // Uploaded, the file may be evicted now: the cache limit holds again.
        cacheLimit.scheduleCheck()
        // A conflict copy was made in the store: bring it here now, not at the next poll.
        if copyMade { storeFeed?.kick(everywhere: false) }
    }

    /// Bytes thrown away (they did not match their digest) may be in the kernel's cache.
    public func contentRejected(_ ino: UInt64) { invalidateKernelCache(ino) }
}
