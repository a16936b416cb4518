import Foundation
import UbiqCoordinator
import UbiqState
import UbiqStore
import UbiqSync

/// Changes made in the store by other devices, applied here (called by the ChangeFeed).
///
/// - A new key becomes a placeholder (folders on the way are made); under a pinned
///   folder its download starts at once.
/// - A new version of a known item updates its metadata; if its content changed, the
///   local copy becomes the new version's placeholder (downloaded again at once if it
///   was local or pinned). An open file is never swapped under its readers: the
///   change waits until the last close (the key is tried again at every poll).
/// - A deleted key removes the local name, unless this device changed the item since
///   (an edit beats a delete: the item is uploaded again), or, for a folder, something
///   is left in it that the store never had.
/// - An item whose content this device changed, and another device changed too, is left
///   alone here: its upload is conditional on the version it started from, and when that
///   fails the Uploader keeps the other version as a conflict copy beside it (docs/sync.md).
///   An item with only a metadata change here takes the new content and keeps its metadata.
///
/// Every change claims the items it touches through the Coordinator, and drops what
/// the kernel cached of them.
extension FileSystem {
    /// Applies `changes`; returns the keys to try again later.
    public func applyRemote(_ changes: [RemoteChange]) -> [String] {
        // What the store says is weighed against this device's rows: new files' rows first.
        do { try commitPendingCreates() } catch {
            logger.warning("remote changes wait: \(error)")
            return changes.map(\.key)
        }
        func depth(_ k: String) -> Int { k.utf8.reduce(0) { $0 + ($1 == UInt8(ascii: "/") ? 1 : 0) } - (k.hasSuffix("/") ? 1 : 0) }
        // Parents before children for additions; children before parents for removals.
        let puts = changes.filter { $0.info != nil }.sorted { (depth($0.key), $0.key) < (depth($1.key), $1.key) }
        let deletes = changes.filter { $0.info == nil }.sorted { (depth($0.key), $0.key) > (depth($1.key), $1.key) }
        var retry: [String] = []
        for c in puts + deletes {
            do {
                let done = try c.info.map { try applyRemotePut(c.key, $0, before: c.recordedBefore) }
                    ?? applyRemoteDelete(c.key, before: c.recordedBefore)
                if !done { retry.append(c.key) }
            } catch {
                logger.warning("could not apply the store's change of \(c.key): \(error)")
                retry.append(c.key)
            }
        }
        return retry
    }

    // MARK: - Additions and updates

    private func applyRemotePut(_ key: String, _ info: ObjectInfo, before: String?) throws -> Bool {
        let (known, doomed) = try state.read { tx in (try tx.entries(remoteKey: key), try tx.hasTombstone(key: key)) }
        if let e = known.first {
            if e.remoteVersion == info.version { return true }
            // This device wrote the key since the store was asked: looked at again next poll.
            if e.remoteVersion != before { return false }
            return try updateFromRemote(e, info)
        }
        if before != nil { return false }  // moved away by this device's uploader meanwhile
        // Deleted here, and that delete is on its way to the store: looked at again once it
        // got there (if the store refuses it, this version is newer and comes in then).
        if doomed { return false }
        return try addFromRemote(key, info)
    }

    private func addFromRemote(_ key: String, _ info: ObjectInfo) throws -> Bool {
        do { try StoreKey.validate(key) } catch {
            logger.warning("skipping store key \(key.debugDescription): \(error)")
            return true
        }
        let (parts, isDirKey) = StoreKey.segments(key)
        // The folders on the way, made as needed.
        var parent = rootIno
        for seg in parts.dropLast() {
            let name = Array(seg.utf8)
            let existing = try inodes.locked { t in try t.directory(parent).children[name] }
            if let existing {
                guard inodes.locked({ t in t[existing]?.isDirectory ?? false }) else {
                    // Tried again at each poll: the file may go, or move away.
                    logger.info("not adding \(key) yet: a file here stands where its folder would be")
                    return false
                }
                parent = existing
            } else {
                guard let made = try makeRemoteNode(in: parent, name: name, type: UInt32(S_IFDIR),
                                                    meta: ObjectMetadata(kind: .directory, mode: 0o755, uid: getuid(),
                                                                         gid: getgid(), mtimeNs: nowNanos()),
                                                    size: 0, remote: nil) else { return false }
                parent = made
            }
        }
        let name = Array(parts.last!.utf8)
        let type = (isDirKey ? ObjectKind.directory : info.metadata.kind).fileType
        if let existing = try inodes.locked({ t in try t.directory(parent).children[name] }) {
            // The same folder made on both sides is one folder.
            let adopt: EntryRecord? = try state.read { tx in
                guard let e = try tx.entry(parent: parent, name: name), e.remoteKey == nil,
                      let r = try tx.inode(existing), r.type == UInt32(S_IFDIR), type == UInt32(S_IFDIR) else { return nil }
                return e
            }
            if let adopt {
                try persistNow { tx in try tx.recordRemote(entryID: adopt.id, key: key, info) }
                // Its mode, owner, times and xattrs come too, unless changed here (a folder this
                // device made and has not uploaded yet keeps its own, to be uploaded on top). A
                // folder made here as the parent of a child the store sent first has none of its own.
                guard let e = try state.read({ try $0.entries(remoteKey: key).first }) else { return true }
                return try updateFromRemote(e, info)
            }
            // Both sides made an item of this name: the local one's upload meets the store's
            // and keeps it as a conflict copy. Tried again at each poll until then (or until
            // the local item moves away, and this one can come in).
            logger.info("not adding \(key) from the store yet: a local item has that name")
            return false
        }
        guard let ino = try makeRemoteNode(in: parent, name: name, type: type, meta: info.metadata, size: info.size,
                                           remote: info) else { return false }
        emit(.changedRemotely, ino)
        if type == UInt32(S_IFREG) && info.size > 0, try isPinned(ino) {
            try? materializer.start(ino)
        }
        return true
    }

    /// Makes a node for an item of the store (a placeholder, for a file). Nil when the
    /// folder changed meanwhile (try again later).
    private func makeRemoteNode(in parent: UInt64, name: [UInt8], type: UInt32, meta: ObjectMetadata, size: Int64,
                                remote: ObjectInfo?) throws -> UInt64? {
        let c = try claim([parent], .write)
        defer { coordinator.release(c) }
        let ino: UInt64? = try inodes.locked { t in
            let dir = try t.directory(parent)
            if dir.children[name] != nil || dir.nlink == 0 { return nil }
            let ino = t.nextIno
            let now = nowNanos()
            let isFile = type == UInt32(S_IFREG)
            var rec = InodeRecord(ino: ino, type: type, perm: meta.mode & 0o7777, uid: meta.uid, gid: meta.gid,
                                  size: isFile ? size : 0, atimeNs: meta.mtimeNs, mtimeNs: meta.mtimeNs, ctimeNs: now,
                                  rdev: meta.rdev, target: meta.target.map { [UInt8]($0) },
                                  present: !isFile || size == 0)
            rec.contentGen = 1
            rec.metaGen = 1
            if isFile && size == 0 { try cache.createEmpty(ino) }
            let xattrs = meta.localXattrs
            try persistNow { tx in
                try tx.upsert(rec)
                try tx.markUploaded(ino, contentGen: 1, metaGen: 1)
                try tx.insertEntry(parent: parent, name: name, ino: ino, remoteKey: remote?.key,
                                   remoteVersion: remote?.version, remoteTag: remote?.contentTag,
                                   remoteDigest: remote?.metadata.sha256)
                try tx.replaceXattrs(ino, xattrs)
            }
            t.attach(rec, in: dir, name: name).xattrs = xattrs
            return ino
        }
        if ino != nil { invalidateKernelEntry(parent, name) }
        return ino
    }

    private func updateFromRemote(_ e: EntryRecord, _ info: ObjectInfo) throws -> Bool {
        let ino = e.ino
        let local = try state.read { try $0.localChanges(ino) }
        if local.content || isOpenForWriting(ino) {
            // Changed on both sides: this device's upload meets the store's version and keeps
            // both (a conflict copy). Tried again at each poll until that has happened.
            logger.info("\(e.remoteKey ?? "?") changed in the store and here: the local edit is kept for its upload to settle")
            return false
        }
        // Metadata changed here only (a chmod, an xattr, a rename waiting to be uploaded): the
        // store's content comes, and this device's metadata stays on it, to be uploaded on top.
        let keepLocalMeta = local.metadata
        guard let kind = inodes.locked({ t in t[ino].map { $0.rec.type } }) else { return true }
        let newType = (info.key.hasSuffix("/") ? ObjectKind.directory : info.metadata.kind).fileType
        if kind != newType {
            // A different kind of item under the same name: the old one goes, the new one comes.
            guard try applyRemoteDelete(e.remoteKey!, before: e.remoteVersion) else { return false }
            return try addFromRemote(info.key, info)
        }
        let isFile = kind == UInt32(S_IFREG)
        let contentChanged = isFile && (e.remoteTag == nil || info.contentTag == nil || e.remoteTag != info.contentTag)
        // A reader keeps the version it opened until it closes.
        if contentChanged && inodes.locked({ t in (t[ino]?.opens ?? 0) > 0 }) {
            waitingForClose.withLock { _ = $0.insert(ino) }
            return false
        }
        let c = try claim([ino], .replace)
        var refetch = false
        let applied: Bool = try {
            defer { coordinator.release(c) }
            return try inodes.locked { t in
                guard let n = t[ino] else { return true }
                if contentChanged && n.opens > 0 { return false }
                // Uploaded by this device since the store was asked: not replaced by what was read.
                let recorded = try state.read { try $0.entries(of: ino).first(where: { $0.id == e.id })?.remoteVersion }
                if recorded != e.remoteVersion { return false }
                guard !n.unpersisted, n.writers == 0 else { return true }
                let now = nowNanos()
                if contentChanged {
                    refetch = n.rec.present || materializer.localBytes(ino) != nil || n.rec.pinned
                    materializer.cancel(ino)
                    cache.remove(ino)
                    n.rec.size = info.size
                    n.rec.present = info.size == 0
                    if info.size == 0 { try cache.createEmpty(ino) }
                    n.contentEpoch += 1
                }
                let m = info.metadata
                n.rec.ctimeNs = now
                if contentChanged || !keepLocalMeta { n.rec.mtimeNs = m.mtimeNs }
                if !keepLocalMeta {
                    n.rec.perm = m.mode & 0o7777
                    n.rec.uid = m.uid
                    n.rec.gid = m.gid
                    n.rec.rdev = m.rdev
                    if let t = m.target { n.rec.target = [UInt8](t) }
                    n.xattrs = m.localXattrs
                }
                let rec = n.rec, xattrs = n.xattrs
                try persistNow { tx in
                    try tx.upsert(rec)
                    try tx.recordRemote(entryID: e.id, key: info.key, info)
                    try tx.replaceXattrs(ino, xattrs)
                    if contentChanged { try tx.removeDownload(ino) }
                }
                return true
            }
        }()
        guard applied else { return false }
        invalidateKernelCache(ino)
        emit(.changedRemotely, ino)
        if refetch || (contentChanged && info.size > 0 && (try? isPinned(ino)) == true) {
            try? materializer.start(ino)
        }
        return true
    }

    // MARK: - Removals

    /// `before`: the version recorded for `key` when the store said it was gone (see RemoteChange).
    private func applyRemoteDelete(_ key: String, before: String?) throws -> Bool {
        guard let e = try state.read({ try $0.entries(remoteKey: key).first }) else { return true }
        // This device wrote the key since the store said it was gone (a rename onto it, a new
        // file of that name): that version is not the one deleted. Looked at again next poll.
        if e.remoteVersion != before { return false }
        let ino = e.ino
        let local = try state.read { try $0.localChanges(ino) }
        let (isDir, hasChildren, isPlaceholder) = inodes.locked { t in
            (t[ino]?.isDirectory ?? false, !(t[ino]?.children.isEmpty ?? true),
             t[ino].map { $0.isRegular && !$0.rec.present } ?? false)
        }
        // An edit beats a delete; so does a rename or a metadata change of what is here in
        // full. A placeholder renamed or chmod-ed here goes: its bytes went with the delete.
        let changedHere = local.content || (local.queued && !isPlaceholder)
        if changedHere || isOpenForWriting(ino) || (isDir && hasChildren) {
            // Changed here, or a folder with something the store never had in it: kept,
            // and uploaded again.
            logger.info("\(key) was deleted in the store but changed here: kept, and uploaded again")
            try persistNow { tx in
                try tx.setRemote(entryID: e.id, key: nil, version: nil)
                try tx.enqueue(ino)
            }
            kickUploader()
            return true
        }
        let gone = events.hasSubscribers ? pathBytes(of: ino) : nil
        let c = try claim([e.parent, ino], .delete)
        let removed: Bool = try {
            defer { coordinator.release(c) }
            return try inodes.locked { t in
                guard let dir = t[e.parent], dir.children[e.name] == ino, let n = t[ino] else { return true }
                if n.isDirectory && !n.children.isEmpty { return false }
                let now = nowNanos()
                dir.rec.mtimeNs = now
                dir.rec.ctimeNs = now
                n.rec.ctimeNs = now
                let dirRec = dir.rec, rec = n.rec
                var superseded = false
                try persistNow { tx in
                    // Checked again in the transaction, where the uploader's record of a new
                    // version would be seen.
                    guard try tx.entries(remoteKey: key).first(where: { $0.id == e.id })?.remoteVersion == before else {
                        superseded = true
                        return
                    }
                    try tx.setRemote(entryID: e.id, key: nil, version: nil)  // gone there already: no tombstone
                    try tx.removeEntry(parent: e.parent, name: e.name)
                    try tx.upsert(dirRec)
                    if n.nlink > 1 && !n.isDirectory { try tx.upsert(rec) }
                }
                if superseded { return false }
                dir.children[e.name] = nil
                if n.isDirectory {
                    n.nlink = 0
                    dir.nlink -= 1
                } else {
                    n.nlink -= 1
                }
                if n.nlink == 0 && n.opens == 0 { materializer.cancel(ino) }
                reapIfUnreferenced(n, t)
                return true
            }
        }()
        if removed {
            logger.info("\(key) was deleted in the store: removed here")
            invalidateKernelEntry(e.parent, e.name)
            if let gone { emit(.deleted, ino, path: gone) }
        }
        return removed
    }

}
