import Foundation

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
    /// The upload of `ino` ended: done, failed, or `conflict` (a conflict copy was made).
    func uploadEnded(_ ino: UInt64, conflict: Bool)
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

/// Where the change feed hands the key-value store's changed objects.
public protocol KeyValueSink: AnyObject, Sendable {
    /// `objectKeys` changed; `initial`: the poll compared everything (a first or reset sync).
    func apply(objectKeys: [String], initial: Bool)
}

extension KVMirror: KeyValueSink {}
