import Foundation

/// Seconds since the epoch as nanoseconds (the unit of `ObjectMetadata.mtimeNs`), a time past
/// what they hold (before 1678, after 2262: a server's "Last-Modified" of 9999, a user's
/// "--newer-than 1e300d") held at the nearest end, which compares the same; NaN is 0. A plain
/// `Int64(seconds * 1e9)` traps on them.
public func nanoseconds(sinceEpoch seconds: Double) -> Int64 {
    let ns = seconds * 1e9
    if ns.isNaN { return 0 }
    return ns >= Double(Int64.max) ? .max : ns <= Double(Int64.min) ? .min : Int64(ns)
}

/// The kind of filesystem object a store object stands for.
public enum ObjectKind: String, Codable, Sendable {
    case file, directory, symlink, fifo, socket, charDevice, blockDevice
}

/// What a store keeps beside an object's bytes: enough to rebuild the
/// file on another device (mode, owner, times, link target, user xattrs).
public struct ObjectMetadata: Codable, Sendable, Equatable {
    public var kind: ObjectKind
    /// Permission bits including setuid/setgid/sticky (the low 12 bits of st_mode).
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    /// Modification time, nanoseconds since the epoch.
    public var mtimeNs: Int64
    public var rdev: UInt64
    /// Symlink target (raw bytes, base64 in JSON).
    public var target: Data?
    /// `user.*` extended attributes, name without the `user.` prefix kept as given.
    public var xattrs: [String: Data]
    /// Who wrote this version: "<device>:<ino>:<generation>". Lets a device
    /// recognise its own upload after a crash instead of calling it a conflict.
    public var origin: String?
    /// The writing device's name, for people (conflict copies are named after it).
    public var device: String?
    /// SHA-256 of the content (hex), set by the device that wrote the bytes. It follows the
    /// bytes: a copy keeps its source version's digest whatever metadata it is given. A device
    /// checks a download against it (nil: another tool wrote the object; nothing to check).
    public var sha256: String?
    /// The item's own name for itself, the same on every device and through every rename, edit
    /// and metadata change: made by the device that first uploads the item, carried by every
    /// upload of it after, on any device. A device that sees a new key holding an id it records
    /// for a key gone from the store applies a move (nothing is downloaded again), for any item
    /// but a folder, bytes or not. Nil: another tool wrote the object, or an older client.
    public var fileID: String?
    /// What could not be read as written, each read as its default instead ("mode: -5",
    /// "kind: whiteout"): metadata from another device, a newer client, a hostile writer.
    /// Empty for metadata this client wrote. Never stored.
    public var issues: [String] = []

    enum CodingKeys: String, CodingKey {
        case kind, mode, uid, gid, mtimeNs, rdev, target, xattrs, origin, device, sha256, fileID
    }

    public init(kind: ObjectKind, mode: UInt32 = 0o644, uid: UInt32 = 0, gid: UInt32 = 0,
                mtimeNs: Int64 = 0, rdev: UInt64 = 0, target: Data? = nil,
                xattrs: [String: Data] = [:], origin: String? = nil, device: String? = nil, sha256: String? = nil,
                fileID: String? = nil) {
        self.kind = kind; self.mode = mode; self.uid = uid; self.gid = gid
        self.mtimeNs = mtimeNs; self.rdev = rdev; self.target = target
        self.xattrs = xattrs; self.origin = origin; self.device = device; self.sha256 = sha256
        self.fileID = fileID
    }

    /// A new item's id (`fileID`).
    public static func newFileID() -> String { UUID().uuidString.lowercased() }

    /// Whether `id` is one a device takes: 1 to 64 letters, digits and `-` (what `newFileID` makes,
    /// with room for another scheme).
    public static func isFileID(_ id: String) -> Bool {
        (1 ... 64).contains(id.utf8.count) && id.utf8.allSatisfy { c in
            (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2D
        }
    }

    /// These metadata with the digest of the bytes they will describe.
    public func describing(digest: String?) -> ObjectMetadata {
        var m = self
        m.sha256 = digest
        return m
    }
}

extension ObjectKind {
    /// The `st_mode` type bits of this kind.
    public var fileType: UInt32 {
        switch self {
        case .file: return UInt32(S_IFREG)
        case .directory: return UInt32(S_IFDIR)
        case .symlink: return UInt32(S_IFLNK)
        case .fifo: return UInt32(S_IFIFO)
        case .socket: return UInt32(S_IFSOCK)
        case .charDevice: return UInt32(S_IFCHR)
        case .blockDevice: return UInt32(S_IFBLK)
        }
    }
}

extension ObjectMetadata {
    /// The extended attributes a device keeps of these (user., trusted., security.), as bytes.
    public var localXattrs: [[UInt8]: [UInt8]] {
        var out: [[UInt8]: [UInt8]] = [:]
        for (k, v) in xattrs where k.hasPrefix("user.") || k.hasPrefix("trusted.") || k.hasPrefix("security.") {
            out[Array(k.utf8)] = [UInt8](v)
        }
        return out
    }
}

/// One version of one object, as the store describes it.
public struct ObjectInfo: Sendable, Equatable {
    public var key: String
    public var version: String
    public var size: Int64
    public var metadata: ObjectMetadata
    /// Names the content bytes: two versions with one tag hold the same bytes (a copy, a
    /// metadata change). nil: the store cannot say. (S3: the ETag; DirectoryStore: the blob.)
    public var contentTag: String?
    /// What the store could not read of this object's record (a column of the wrong type):
    /// such an object is `unusable`.
    public var defect: String?
    public init(key: String, version: String, size: Int64, metadata: ObjectMetadata, contentTag: String? = nil,
                defect: String? = nil) {
        self.key = key; self.version = version; self.size = size; self.metadata = metadata
        self.contentTag = contentTag; self.defect = defect
    }
}

/// When a write may happen.
public enum WriteCondition: Sendable, Equatable {
    /// Unconditionally.
    case always
    /// Only if no object exists at the key (create).
    case ifAbsent
    /// Only if the current version is this one (update from a known version).
    case ifMatch(String)
}

/// One entry of the store's change feed.
public struct StoreChange: Sendable, Equatable {
    public enum Kind: String, Sendable { case put, delete }
    /// What a key holds now, as the store found out while it read its feed.
    public enum Current: Sendable, Equatable { case object(ObjectInfo), absent }
    public var kind: Kind
    public var key: String
    /// The version written; nil for deletes (and where the store cannot say).
    public var version: String?
    /// What the feed says this put wrote, as its writer said (the S3 change log's entry), not
    /// checked: enough to know a device's own write, never to apply one (nil: it does not say).
    public var claimed: ObjectInfo?
    /// What the key holds now, where the store knows it already (the S3 store: a listing of
    /// the key's folder confirmed the log's entry): the feed asks nothing more. nil: ask.
    public var current: Current?

    public init(kind: Kind, key: String, version: String?, claimed: ObjectInfo? = nil, current: Current? = nil) {
        self.kind = kind; self.key = key; self.version = version; self.claimed = claimed; self.current = current
    }
}

public struct ChangeBatch: Sendable {
    public var changes: [StoreChange]
    /// Pass this to the next `changes(since:)` call.
    public var cursor: String
    /// True when the store could not answer from the cursor (too old):
    /// the caller must fall back to a full listing.
    public var reset: Bool
    /// True when more changes wait after `cursor` (ask again).
    public var more: Bool
    /// Changes the store holds but could not read (a key that is not UTF-8, an unknown
    /// operation), described for the log: passed over.
    public var unreadable: [String]

    public init(changes: [StoreChange], cursor: String, reset: Bool, more: Bool = false, unreadable: [String] = []) {
        self.changes = changes; self.cursor = cursor; self.reset = reset; self.more = more; self.unreadable = unreadable
    }
}

/// What a store said (answers) and how reaching it failed (failures).
public enum StoreError: Error, Equatable, CustomStringConvertible {
    // Answers.
    case notFound(key: String)
    case preconditionFailed(key: String, current: String?)
    case invalidKey(String, reason: String)
    case quotaExceeded(key: String)
    // Failures worth retrying.
    case unavailable(String)
    // Failures not worth retrying.
    case failed(String)

    public var isTransient: Bool {
        if case .unavailable = self { return true }
        return false
    }

    public var isNotFound: Bool {
        if case .notFound = self { return true }
        return false
    }

    public var isPreconditionFailed: Bool {
        if case .preconditionFailed = self { return true }
        return false
    }

    public var description: String {
        switch self {
        case .notFound(let k): return "no object at \(k)"
        case .preconditionFailed(let k, let cur): return "\(k) changed in the store (now \(cur ?? "absent"))"
        case .invalidKey(let k, let why): return "invalid key \(k.debugDescription): \(why)"
        case .quotaExceeded(let k): return "store quota exceeded writing \(k)"
        case .unavailable(let why): return "store unavailable: \(why)"
        case .failed(let why): return "store error: \(why)"
        }
    }
}

/// A cloud object store as ubiq needs it: versioned objects under
/// slash-separated keys, conditional writes, ranged reads pinned to a
/// version, server-side copy, and a change feed.
///
/// Keys: files are `a/b/c`; directories are marker objects `a/b/` (trailing
/// slash). Every segment is non-empty UTF-8, not `.` or `..`, without NUL,
/// at most 255 bytes (see `StoreKey.validate`).
public protocol CloudStore: Sendable {
    /// The current version of `key`. Throws `notFound`.
    func head(_ key: String) async throws -> ObjectInfo

    /// Every current object whose key starts with `prefix` (recursive), in key order.
    func list(prefix: String) async throws -> [ObjectInfo]

    /// The same listing handed to `body` in pages of at most `size` objects, in key order, so
    /// that a caller that takes a page at a time holds no more (an import of a million keys).
    /// Each page's keys are first offered to `wanted`, which says of each (in order) whether
    /// to describe it: the others are passed over without their metadata being read (a mount
    /// again knows nearly every key), and a page left empty is not handed on. By default one
    /// `list` cut into pages; a store that can read a page at a time does.
    func list(prefix: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
              _ body: ([ObjectInfo]) throws -> Void) async throws

    /// Bytes `range` (clamped to the object) of `version` of `key`.
    /// Throws `notFound` when that version is gone: a read never mixes versions.
    func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data

    /// Writes bytes `range` (clamped) of `version` of `key` into the file `fd` at `offset`;
    /// returns how many. The default reads, then writes; a store that can copy without
    /// bringing the bytes into the process does that.
    func read(_ key: String, version: String, range: Range<Int64>, into fd: Int32, at offset: Int64) async throws -> Int64

    /// Writes the file at `source` (nil: empty content) as a new version of
    /// `key` if `condition` holds; throws `preconditionFailed` otherwise.
    func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
             condition: WriteCondition) async throws -> ObjectInfo

    /// `put`, telling `progress` the bytes sent so far, as far as the store can tell (the
    /// default tells nothing).
    func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
             condition: WriteCondition, progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo

    /// Server-side copy of `version` of `source` to `destination`, optionally
    /// with new metadata (copy onto itself updates metadata only).
    func copy(from source: String, version: String, to destination: String,
              metadata: ObjectMetadata?, condition: WriteCondition) async throws -> ObjectInfo

    /// Deletes `key` if `condition` holds. Deleting an absent key with
    /// `.always` succeeds.
    func delete(_ key: String, condition: WriteCondition) async throws

    /// A move's second half: deletes `key`, whose `version` was just copied to `destination`,
    /// if it still holds that version (as `delete` with `.ifMatch(version)`, the default). A
    /// store that tells other devices of changes by a log (S3) may make it later, with the
    /// move's log entry, so that they read the old key until they learn of the move; this
    /// device sees the key as deleted at once.
    func deleteMoved(_ key: String, version: String, to destination: String) async throws

    /// Changes after `cursor` (nil: from the beginning of the feed), at most `limit`.
    func changes(since cursor: String?, limit: Int) async throws -> ChangeBatch

    /// The feed's cursor as of now: every change made after this call comes after it.
    func currentCursor() async throws -> String

    /// The cursor a device new to the store starts from (`ChangeFeed.prepare`), where finding
    /// it may list the store: a store whose cursor is a listing (S3) lists its first `objects`
    /// only, and hands that part to the next `list` of the whole store, which then throws
    /// `ListingCutShort` (the importer brings in that many before the mount answers; the feed's
    /// first full listing takes the rest). By default, `currentCursor()`.
    func startingCursor(listingFirst objects: Int) async throws -> String

    /// Prior and current versions of `key`, newest first.
    func versions(of key: String) async throws -> [ObjectInfo]

    /// Bytes used and the quota, where the store has them (nil: it does not say).
    func usage() async throws -> StoreUsage?

    /// Whether a version stays readable after a newer one replaces it (prior versions kept).
    var keepsPriorVersions: Bool { get }

    /// Makes what this device changed visible in the feed, where the store holds it back to
    /// send in batches (the S3 store's change log); an upload round calls it when it ends.
    /// `holdingMoves`: more rounds follow at once (the outbox has more due), so a move under
    /// way (a folder's files copied to new keys and their old keys deleted) may wait for them
    /// and reach the feed whole (docs/s3.md).
    func publishChanges(holdingMoves: Bool) async throws

    /// Asks that the next `changes(since:)` also find what was changed without the feed
    /// knowing (another tool's objects in a bucket), where that costs more than a poll.
    func lookEverywhereNext()

    /// The changes of the last `changes(since:)` with what their keys hold now, where the store
    /// can say so for many at once more cheaply than a `head` each (the S3 store: one listing
    /// of a folder where many of its files changed); the others are handed back as they came
    /// (`current` nil). The feed asks after it has read what it recorded of those keys, as it
    /// does before a `head`. Never throws: what cannot be told is asked for with `head`. By
    /// default, nothing is told.
    func confirmed(_ changes: [StoreChange]) async -> [StoreChange]
}

extension CloudStore {
    public var keepsPriorVersions: Bool { true }

    public func startingCursor(listingFirst objects: Int) async throws -> String { try await currentCursor() }

    public func list(prefix: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
                     _ body: ([ObjectInfo]) throws -> Void) async throws {
        let all = try await list(prefix: prefix)
        for first in stride(from: 0, to: all.count, by: max(1, size)) {
            let page = all[first ..< min(all.count, first + max(1, size))]
            let kept = zip(page, try wanted(page.map(\.key))).filter(\.1).map(\.0)
            if !kept.isEmpty { try body(kept) }
        }
    }

    /// Every object of the listing, in pages (see above).
    public func list(prefix: String, pagesOf size: Int, _ body: ([ObjectInfo]) throws -> Void) async throws {
        try await list(prefix: prefix, pagesOf: size, wanted: { $0.map { _ in true } }, body)
    }
    public func deleteMoved(_ key: String, version: String, to destination: String) async throws {
        try await delete(key, condition: .ifMatch(version))
    }
    public func publishChanges(holdingMoves: Bool) async throws {}
    /// All of it, moves under way too.
    public func publishChanges() async throws { try await publishChanges(holdingMoves: false) }
    public func lookEverywhereNext() {}
    public func confirmed(_ changes: [StoreChange]) async -> [StoreChange] { changes }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata,
                    condition: WriteCondition, progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        try await put(key, contentsOf: source, metadata: metadata, condition: condition)
    }

    public func read(_ key: String, version: String, range: Range<Int64>, into fd: Int32, at offset: Int64) async throws -> Int64 {
        let data = try await read(key, version: version, range: range)
        try LocalWriteError.write(data, to: fd, at: offset)
        return Int64(data.count)
    }
}

/// A listing of the whole store ended after its first part (`startingCursor(listingFirst:)`):
/// what was handed on is only that part, and no key past it may be taken as gone.
public struct ListingCutShort: Error, CustomStringConvertible {
    public init() {}
    public var description: String { "the store's listing was only its first part (the rest comes with the next full listing)" }
}

/// Writing what a store sent into a local file failed (`errno`: ENOSPC, EIO...).
public struct LocalWriteError: Error, CustomStringConvertible {
    public let errno: Int32
    public init(errno: Int32) { self.errno = errno }
    public var description: String { "writing the local copy: \(String(cString: strerror(self.errno)))" }

    /// Writes all of `data` into `fd` at `offset`.
    public static func write(_ data: Data, to fd: Int32, at offset: Int64) throws {
        try data.withUnsafeBytes { buf in
            var done = 0
            while done < buf.count {
                let n = pwrite(fd, buf.baseAddress! + done, buf.count - done, off_t(offset) + off_t(done))
                if n < 0 {
                    let e = Glibc.errno
                    if e == EINTR { continue }
                    throw LocalWriteError(errno: e)
                }
                done += n
            }
        }
    }
}

public struct StoreUsage: Sendable, Equatable {
    public var usedBytes: Int64
    /// nil: no quota.
    public var quotaBytes: Int64?
    public init(usedBytes: Int64, quotaBytes: Int64?) { self.usedBytes = usedBytes; self.quotaBytes = quotaBytes }
}

/// Keys under `.ubiquity/` are ubiq's own (the key-value store, a store's internals): never
/// files. A mount refuses the name `.ubiquity` at its root.
public enum ReservedKeys {
    public static let root = ".ubiquity/"
    /// One object per key of the synced key-value store (`ubiq kv`).
    public static let kv = ".ubiquity/kv/"
    /// The top-level name a mount does not let anyone create.
    public static let rootName = Array(".ubiquity".utf8)

    public static func isReserved(_ key: String) -> Bool { key.hasPrefix(root) || key == ".ubiquity" }
}

public enum StoreKey {
    public static let maxSegmentBytes = 255
    public static let maxKeyBytes = 4096

    /// Throws `invalidKey` unless `key` is a well-formed file or directory key.
    public static func validate(_ key: String) throws {
        // One pass over the bytes, making nothing (every key of a listing comes through here).
        let bytes = key.utf8
        let body = bytes.last == UInt8(ascii: "/") ? bytes.dropLast() : bytes[...]
        if body.isEmpty { throw StoreError.invalidKey(key, reason: "empty") }
        if bytes.count > maxKeyBytes { throw StoreError.invalidKey(key, reason: "too long") }
        if bytes.contains(0) { throw StoreError.invalidKey(key, reason: "contains NUL") }
        var length = 0, dots = 0
        func segmentEnds() throws {
            if length == 0 { throw StoreError.invalidKey(key, reason: "empty segment") }
            if dots == length && length <= 2 { throw StoreError.invalidKey(key, reason: "dot segment") }
            if length > maxSegmentBytes { throw StoreError.invalidKey(key, reason: "segment too long") }
        }
        for b in body {
            if b == UInt8(ascii: "/") {
                try segmentEnds()
                length = 0; dots = 0
            } else {
                length += 1
                if b == UInt8(ascii: ".") { dots += 1 }
            }
        }
        try segmentEnds()
    }

    /// The folder a file key is in, as a prefix ("a/b/" of "a/b/c"; "" at the top).
    public static func folder(of key: String) -> String {
        guard let slash = key.utf8.lastIndex(of: UInt8(ascii: "/")) else { return "" }
        return String(key[...slash])
    }

    /// Splits a validated-or-not key into its segments and whether it names a directory.
    public static func segments(_ key: String) -> (parts: [String], isDirectory: Bool) {
        let dir = key.hasSuffix("/")
        let body = dir ? String(key.dropLast()) : key
        return (body.split(separator: "/", omittingEmptySubsequences: false).map(String.init), dir)
    }
}
