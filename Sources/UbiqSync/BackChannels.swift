import Foundation
import UbiqState
import UbiqStore

// The back-channels from the sync engine to what it serves: what each part asks of, or tells,
// the one above it. The file system (UbiqFS) is each of them for its device; `Engine` wires
// them in one place. A part holds the file system weakly (the file system holds the parts),
// the change feed holds its sinks (they outlive it).

/// What the uploader asks of the file system it uploads for.
public protocol UploadHost: AnyObject, Sendable {
    /// Whether `ino` is still open for writing: its upload waits for the close.
    func isOpenForWriting(_ ino: UInt64) -> Bool
    /// Seconds since the last local change, and since the last read of a file's bytes: uploads
    /// wait while the mount is busy, so they do not compete with it for the disk.
    var secondsSinceLastChange: TimeInterval { get }
    var secondsSinceLastRead: TimeInterval { get }
    /// The upload of `ino` ended: done, failed, a `conflict` (kept here, refused by the store),
    /// or `copyMade` (the store's version kept beside it as a conflict copy, which the feed
    /// brings in).
    func uploadEnded(_ ino: UInt64, conflict: Bool, copyMade: Bool)
}

/// What downloads tell of the content they fetched.
public protocol ContentSink: AnyObject, Sendable {
    /// `ino`'s content is wholly local and synced, as `version` (on a download thread: the item
    /// may stand for another by the time it runs, and then the bytes are not its own).
    func contentArrived(_ ino: UInt64, version: String)
    /// Bytes already in `ino`'s cache file were thrown away (the whole did not match its
    /// digest): readers may hold them in a cache.
    func contentRejected(_ ino: UInt64)
}

/// Where the change feed hands the changes it found in the store.
public protocol RemoteChangeSink: AnyObject, Sendable {
    /// Writes the rows of what this device made that are not written yet (new files' rows
    /// wait half a second), so that the store's changes are weighed against all of them.
    func commitPendingCreates() throws
    /// Applies `batch` (its moves as moves); returns the keys to try again at the next poll.
    func applyRemote(_ batch: RemoteBatch) -> [String]
    /// A poll reached the store (after its changes were applied): what failed for want of it
    /// may stop saying so (downloads that failed while it could not be reached).
    func storeAnswered()
}

/// What applying the store's changes asks of the file system (`RemoteApplier` decides which
/// change wins; these carry it out): its items made, moved, updated and removed as the store
/// has them, each under its claims, with its rows, the kernel's notices and the events. Each
/// checks, in its transaction, that the rows it read are still so (else it changes nothing and
/// says so: the key is tried again at the next poll).
public protocol StoreItemHost: AnyObject, Sendable {
    /// As `RemoteChangeSink`'s.
    func commitPendingCreates() throws
    func storeAnswered()
    /// Whether `ino` is open for writing (or written and not yet recorded).
    func isOpenForWriting(_ ino: UInt64) -> Bool
    /// The item named `name` in folder `dir`; nil when none. Throws when `dir` is no folder.
    func child(of dir: UInt64, named name: [UInt8]) throws -> StoreItemFacts?
    /// What item `ino` is now; nil when it is gone.
    func facts(_ ino: UInt64) -> StoreItemFacts?
    /// Whether `ino` or a folder it is in is pinned; pins `ino`.
    func isPinned(_ ino: UInt64) throws -> Bool
    func setPinned(_ ino: UInt64, _ pinned: Bool) throws
    /// Makes the store's new items `run` (all in folder `dir`, new here) in one transaction
    /// under one claim of the folder, but for those `leaving` names (asked under that claim).
    func makeItems(in dir: UInt64, _ run: [ObjectInfo], leaving: ([ObjectInfo]) throws -> Set<KeyBytes>) throws -> StoreItemRun
    /// Makes one item of the store (`remote`: its key and version; nil: a folder on the way to
    /// one, with no key of its own); nil when the name was taken or the folder went meanwhile.
    func makeItem(in dir: UInt64, name: [UInt8], type: UInt32, meta: ObjectMetadata, size: Int64, remote: ObjectInfo?) throws -> UInt64?
    /// Records that entry `e` (a folder made here too) stands for `info`.
    func record(_ e: EntryRecord, as info: ObjectInfo) throws
    /// Moves entry `e`'s item to `name` in folder `dir` and records it at `key`, still at its
    /// old version (with `tag` and `digest` for its bytes); false when it changed meanwhile.
    func moveItem(_ e: EntryRecord, to dir: UInt64, name: [UInt8], key: String, tag: String?, digest: String?) throws -> Bool
    /// Takes `info` for entry `e`'s item: its metadata unless `keepLocalMeta`, and when
    /// `contentChanged`, its bytes (the local copy becomes a placeholder). Nil when it changed
    /// meanwhile; else whether the old bytes were here (then the new ones should come).
    func updateItem(_ e: EntryRecord, to info: ObjectInfo, contentChanged: Bool, keepLocalMeta: Bool) throws -> Bool?
    /// One name of a hard link (entry `e`) got new bytes `info` in the store, which holds each
    /// name as a file of its own: the name leaves the link and becomes a placeholder of its own;
    /// the link's other names keep what they hold. The new item; nil when it changed meanwhile.
    func splitLink(_ e: EntryRecord, to info: ObjectInfo) throws -> UInt64?
    /// Calls for a poll once `ino`'s last reader closed it (its update waits for that).
    func updateAtLastClose(_ ino: UInt64)
    /// Keeps entry `e`'s item, deleted in the store, and sends it up again.
    func sendAgain(_ e: EntryRecord) throws
    /// Removes entry `e`'s name (the store deleted its key), unless the entry records another
    /// version than `before` by then; whether it was removed (or was gone already).
    func removeItem(_ e: EntryRecord, unlessRecordedSince before: String?) throws -> Bool
    /// Removes folder `dir`, empty here, if `still` holds of it in the transaction; its parent.
    func removeEmptyFolder(_ dir: UInt64, if still: (StateTransaction, UInt64) throws -> Bool) -> UInt64?
}

/// What the sync engine weighs of an item of the file system.
public struct StoreItemFacts: Sendable {
    /// The file system's root.
    public static let rootIno: UInt64 = 1
    public var ino: UInt64
    /// S_IFREG, S_IFDIR, …
    public var type: UInt32
    public var hasChildren = false
    /// A file whose bytes are not here.
    public var isPlaceholder = false
    /// A file of more than one name (a hard link).
    public var linked = false
    public var isOpen = false
    public var pinned = false
    public var isDirectory: Bool { type == UInt32(S_IFDIR) }

    public init(ino: UInt64, type: UInt32) {
        self.ino = ino
        self.type = type
    }
}

/// What `StoreItemHost.makeItems` made (new items, and their sizes), what it left for one at
/// a time (a name taken here), and the keys to try again later.
public struct StoreItemRun: Sendable {
    public var made: [(ino: UInt64, size: Int64)] = []
    public var oneByOne: [ObjectInfo] = []
    public var retry: [String] = []
    public init() {}
}

/// Where the change feed hands the key-value store's changed objects.
public protocol KeyValueSink: AnyObject, Sendable {
    /// `objectKeys` changed; `initial`: the poll compared everything (a first or reset sync).
    func apply(objectKeys: [String], initial: Bool)
}

extension KVMirror: KeyValueSink {}
