import Foundation
import UbiqState
import UbiqSync

/// The sync state of one item, as the `user.ubiq.*` attributes and `ubiq status` show it.
/// Read from memory and the state database: never downloads, never waits for a download.
public struct ItemStatus: Sendable, Equatable {
    /// The most urgent word that applies.
    public var status: SyncStatus
    public var isDirectory: Bool
    /// Files: not-downloaded, downloaded (a newer version waits for the file's readers to
    /// close), current.
    public var downloadingStatus: String
    public var downloading: Bool
    public var percentDownloaded: Int
    public var uploaded: Bool
    public var uploading: Bool
    /// 100 when uploaded; while an upload is under way, how far it has got; else 0.
    public var percentUploaded: Int = 0
    public var conflict: Bool
    public var pinned: Bool
    /// The store version this item stands for ("" when it has none).
    public var version: String
    public var downloadError: String
    public var uploadError: String
    /// Bytes here, and in all (files).
    public var localBytes: Int64
    public var size: Int64
    /// Folders: counts over everything under them.
    public var itemsNotDownloaded: Int
    public var itemsUploading: Int
    public var itemsConflicts: Int
    public var itemsErrors: Int
    public var items: Int
}

extension FileSystem {
    /// The read-only attributes of a file, and of a folder (names after "user.ubiq."), as
    /// `ubiq status` reads them and its help lists them.
    public static let statusAttributes = ["status", "downloading-status", "downloading", "percent-downloaded", "uploaded",
                                   "uploading", "percent-uploaded", "conflicts", "pinned", "version",
                                   "downloading-error", "uploading-error"]
    public static let folderAttributes = ["status", "pinned", "items", "items-not-downloaded", "items-uploading",
                                   "items-conflicts", "items-errors"]
    /// The mount's root's, of its store: when a look at its changes last reached it (UTC, ISO
    /// 8601; empty: not since the mount), why the last look failed (empty: it did not), and "1"
    /// while a mount again's listing of the whole store is under way (docs/sync.md).
    /// And `sync-paused`: empty, `indefinitely` (until `ubiq resume`) or when the pause ends.
    public static let storeAttributes = ["store-reached", "store-error", "store-listing", "sync-paused"]

    /// The value of a read-only status attribute (`name` without "user.ubiq."); nil: not one.
    func statusAttribute(_ ino: UInt64, _ name: String) throws -> [UInt8]? {
        if ino == rootIno && name == "control-socket" {
            guard let p = controlSocketPath.withLock({ $0 }) else { throw FSError.noAttribute }
            return Array(p.utf8)
        }
        if ino == rootIno && name == "cache-bytes" { return Array(String(localContentBytes).utf8) }
        if ino == rootIno && name == "cache-limit" { return Array(String(cacheLimit.limit ?? 0).utf8) }
        if ino == rootIno && Self.storeAttributes.contains(name) {
            let look = storeFeed?.look ?? ChangeFeed.Look()
            switch name {
            case "store-reached": return Array((look.reached.map { ISO8601DateFormatter().string(from: $0) } ?? "").utf8)
            case "store-error": return Array((look.error ?? "").utf8)
            case "sync-paused": return Array((uploader?.pause?.attribute ?? "").utf8)
            default: return Array((look.listing ? "1" : "0").utf8)
            }
        }
        let known = Self.statusAttributes.contains(name) || Self.folderAttributes.contains(name)
        guard known else { return nil }
        let s = try itemStatus(ino, countingPlaceholders: name == "items-not-downloaded")
        let flag = { (b: Bool) in b ? "1" : "0" }
        let value: String
        switch (s.isDirectory, name) {
        case (_, "status"): value = s.status.rawValue
        case (_, "pinned"): value = flag(s.pinned)
        case (true, "items"): value = String(s.items)
        case (true, "items-not-downloaded"): value = String(s.itemsNotDownloaded)
        case (true, "items-uploading"): value = String(s.itemsUploading)
        case (true, "items-conflicts"): value = String(s.itemsConflicts)
        case (true, "items-errors"): value = String(s.itemsErrors)
        case (false, "downloading-status"): value = s.downloadingStatus
        case (false, "downloading"): value = flag(s.downloading)
        case (false, "percent-downloaded"): value = String(s.percentDownloaded)
        case (false, "uploaded"): value = flag(s.uploaded)
        case (false, "uploading"): value = flag(s.uploading)
        case (false, "percent-uploaded"): value = String(s.percentUploaded)
        case (false, "conflicts"): value = flag(s.conflict)
        case (false, "version"): value = s.version
        case (false, "downloading-error"): value = s.downloadError
        case (false, "uploading-error"): value = s.uploadError
        default: throw FSError.noAttribute  // a file attribute asked of a folder, or the reverse
        }
        return Array(value.utf8)
    }

    /// The sync state of `ino` (for a folder, summed over everything under it;
    /// `countingPlaceholders`: with `itemsNotDownloaded`, the one figure that reads a row of
    /// every file under it that is not in memory).
    public func itemStatus(_ ino: UInt64, countingPlaceholders: Bool = true) throws -> ItemStatus {
        let isDir = try inodes.locked { t in try t.node(ino).isDirectory }
        if !isDir { return try fileStatus(ino) }
        // Three queries for the whole subtree, whatever its size (partial indexes keep them
        // proportional to what is pending, not to the tree).
        let (queued, errors, notInStore) = try readState { tx in
            (try tx.outboxInodes(), try tx.uploadErrors(), try tx.inodesNotInStore())
        }
        let inos = inodes.locked { t in t.subtree(ino) }
        let withCopies = itemsWithConflictCopies(inos)
        let transfers = materializer.downloadsAndFailures()
        // Only folders and the items those sets name can be more than current or a placeholder
        // (`SyncStatus.rules`): each of them is asked in full. The others, most of a large
        // tree, are counted, and their nodes are not read in (a walk of 100,000 files' nodes
        // past the nodes kept in memory took 40 s, at every `ubiq sync`).
        var full: [UInt64] = [], plainPlaceholders = 0, unread: [UInt64: Int] = [:]
        inodes.locked { t in
            for i in inos {
                if i == ino || queued.contains(i) || errors[i] != nil || notInStore.contains(i) || withCopies.contains(i)
                    || transfers.contains(i) {
                    full.append(i)
                } else if let n = t.resident(i) {
                    if n.isDirectory { full.append(i) } else if n.rec.type == UInt32(S_IFREG) && !n.rec.present { plainPlaceholders += 1 }
                } else {
                    unread[i, default: 0] += 1  // a file's node (folders stay in memory)
                }
            }
        }
        var s = ItemStatus(status: .current, isDirectory: true, downloadingStatus: "", downloading: false,
                           percentDownloaded: 0, uploaded: true, uploading: false, conflict: false,
                           pinned: (try? isPinned(ino)) ?? false, version: "", downloadError: "", uploadError: "",
                           localBytes: 0, size: 0, itemsNotDownloaded: 0, itemsUploading: 0, itemsConflicts: 0,
                           itemsErrors: 0, items: inos.count - 1)
        if countingPlaceholders {
            s.itemsNotDownloaded = plainPlaceholders + (try readState { try $0.placeholderCount(among: unread) })
        }
        for i in full {
            let known = SyncFacts(queued: queued.contains(i), error: errors[i]?.error, conflict: errors[i]?.conflict ?? false,
                                  localOnly: errors[i]?.localOnly ?? false, inStore: !notInStore.contains(i), version: "", hasConflictCopies: withCopies.contains(i))
            let f = try fileStatus(i, known: known, ownPinOnly: i != ino)
            // The counts are of what is under the folder, as `items` (docs/status.md); the
            // folder's own state shows in its status word and its uploading/uploaded.
            if i != ino {
                if countingPlaceholders && f.isDirectory == false && f.downloadingStatus == "not-downloaded" { s.itemsNotDownloaded += 1 }
                if f.uploading { s.itemsUploading += 1 }
                if f.conflict { s.itemsConflicts += 1 }
                if f.status == .error { s.itemsErrors += 1 }
            }
            s.status = max(s.status, f.status)
        }
        // A folder is `current` only when everything under it is here: one with a file in the
        // cloud under it is `placeholder` (Files shows "In the cloud"), as iCloud Drive's and
        // OneDrive's folders are, unless something more urgent applies.
        if s.status == .current {
            var inCloud = plainPlaceholders > 0 || s.itemsNotDownloaded > 0
            if !inCloud && !countingPlaceholders {
                inCloud = try readState { try $0.anyPlaceholder(among: Set(unread.keys)) }
            }
            if inCloud { s.status = .placeholder }
        }
        let selfQueued = try readState { try $0.isQueued(ino) }
        s.uploaded = s.itemsUploading == 0 && !selfQueued
        s.uploading = s.itemsUploading > 0 || selfQueued
        return s
    }

    /// The item's own status word (for a folder: the folder itself, not what is under it;
    /// what `ubiq query` reports).
    public func ownStatus(_ ino: UInt64) throws -> SyncStatus { try fileStatus(ino).status }

    func readState<T>(_ body: (StateTransaction) throws -> T) throws -> T {
        // New files' rows first, so that what it reads has them.
        try commitPendingCreates()
        // The body's own answers (not found, not uploaded) pass as they are; a failure of the
        // database itself is an I/O error.
        do { return try state.read(body) } catch let e as FSError { throw e } catch { throw FSError.io("state database: \(error)") }
    }

    /// What the state database says of an item's sync.
    struct SyncFacts {
        var queued: Bool
        var error: String?
        var conflict: Bool
        /// Kept on this device only by design (the error says why).
        var localOnly: Bool
        var inStore: Bool
        /// The store version ("" when not in the store, or not asked for).
        var version: String
        /// A conflict copy sits beside it.
        var hasConflictCopies: Bool
    }

    private func syncFacts(_ ino: UInt64) throws -> SyncFacts {
        var (facts, names) = try readState { tx in
            let up = try tx.uploadState(ino)
            let entries = try tx.entries(of: ino)
            let entry = entries.first { $0.remoteKey != nil }
            return (SyncFacts(queued: try tx.isQueued(ino), error: up?.error, conflict: up?.conflict ?? false,
                              localOnly: up?.localOnly ?? false, inStore: entry != nil, version: entry?.remoteVersion ?? "", hasConflictCopies: false),
                    entries.map { ($0.parent, $0.name) })
        }
        facts.hasConflictCopies = hasConflictCopies(names)
        return facts
    }

    /// The status of one item, its own (`known`: facts read in bulk for a summary).
    private func fileStatus(_ ino: UInt64, known: SyncFacts? = nil, ownPinOnly: Bool = false) throws -> ItemStatus {
        let (rec, isDir) = try inodes.locked { t -> (InodeRecord, Bool) in
            let n = try t.node(ino)
            return (n.rec, n.isDirectory)
        }
        let facts = try known ?? syncFacts(ino)
        let (isQueued, upError, inStore) = (facts.queued, facts.error, facts.inStore)
        let isFile = rec.type == UInt32(S_IFREG)
        let partial = isFile && !rec.present ? materializer.localBytes(ino) : nil
        let local: Int64 = isFile ? (rec.present ? rec.size : (partial ?? 0)) : 0
        let downloading = partial != nil
        let conflict = (upError != nil && facts.conflict) || facts.hasConflictCopies
        let downloadError = isFile ? (materializer.lastError(ino) ?? "") : ""
        let waiting = waitingForClose.withLock { $0.contains(ino) }
        var known = SyncStatus.Facts()
        known.conflict = conflict
        known.queued = isQueued
        known.localOnly = facts.localOnly
        known.uploadFailed = upError != nil
        known.downloadFailed = !downloadError.isEmpty
        known.downloading = downloading
        known.inStore = inStore
        known.isRoot = ino == rootIno
        known.placeholder = isFile && !rec.present
        let status = SyncStatus.of(known)
        let percent = isFile ? (rec.present ? 100 : (rec.size == 0 ? 0 : Int(local * 100 / rec.size))) : 100
        let uploaded = !isQueued && inStore && upError == nil
        let percentUploaded = uploaded ? 100 : (uploader?.uploadPercent(ino) ?? 0)
        return ItemStatus(status: status, isDirectory: isDir,
                          downloadingStatus: !isFile ? "current" : (!rec.present ? "not-downloaded" : (waiting ? "downloaded" : "current")),
                          downloading: downloading, percentDownloaded: percent,
                          uploaded: uploaded, uploading: isQueued,
                          percentUploaded: percentUploaded,
                          conflict: conflict, pinned: ownPinOnly ? rec.pinned : ((try? isPinned(ino)) ?? false),
                          version: facts.version, downloadError: downloadError, uploadError: upError ?? "",
                          localBytes: local, size: isFile ? rec.size : 0, itemsNotDownloaded: 0, itemsUploading: 0,
                          itemsConflicts: 0, itemsErrors: 0, items: 0)
    }
}

extension FileSystem {
    /// The folder at `path` (names below the root, "/"-separated; "" is the root).
    public func folder(at path: String) throws -> UInt64 {
        let ino = try item(at: path)
        _ = try inodes.locked { t in try t.directory(ino) }
        return ino
    }

    /// `ubiq query`: items under the folder `scope` that match `spec`, from the state database.
    public func query(scope: String, _ spec: QuerySpec) throws -> [QueryRow] {
        var rows: [QueryRow] = []
        try query(scope: scope, spec) { rows.append($0); return true }
        return rows
    }

    /// The same, one row at a time in order, until `each` says false. `each` runs inside the
    /// state database's read, which every request waits for: it must take no lock and wait
    /// for nothing (`ControlServer` writes the reply's text, and sends it after).
    public func query(scope: String, _ spec: QuerySpec, each: (QueryRow) throws -> Bool) throws {
        let start = try folder(at: scope)
        let withCopies = itemsWithConflictCopies(inodes.locked { t in t.subtree(start) })
        let downloading = Set(materializer.downloadedSoFar().map(\.ino))
        var left = spec.limit.map { max(0, $0) } ?? Int.max
        guard left > 0 else { return }
        // What the database says may be asked of it, unless a conflict is wanted (any status
        // there may be one here); a placeholder may be downloading.
        var among = spec.status.map(Set.init)
        if among?.contains(.conflict) == true { among = nil }
        if among?.contains(.downloading) == true { among?.insert(.placeholder) }
        try readState { tx in
            try tx.query(scope: start, spec, among: among) { r in
                var r = r
                if withCopies.contains(r.ino) { r.status = .conflict }
                if r.status == .placeholder && downloading.contains(r.ino) { r.status = .downloading }
                if let wanted = spec.status, !wanted.contains(r.status) { return true }
                left -= 1
                return try each(r) && left > 0
            }
        }
    }
}
