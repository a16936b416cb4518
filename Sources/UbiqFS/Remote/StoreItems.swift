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
    /// Applies `batch`, its moves as moves (the change feed paired them: `RemoteMoves`);
    /// returns the keys to try again later.
    public func applyRemote(_ batch: RemoteBatch) -> [String] {
        // What the store says is weighed against this device's rows: new files' rows first.
        do { try commitPendingCreates() } catch {
            logger.warning("remote changes wait: \(error)")
            return batch.changes.map(\.key)
        }
        let (puts, deletes, moves) = (batch.puts, batch.deletes, batch.moves)
        var retry: [String] = []
        // The folders that held what the store deleted: one with no marker in the store that is
        // left empty here went from the store with its last file (below).
        let emptying = (try? state.read { tx in Set(try deletes.compactMap { try tx.entries(remoteKey: $0.key).first?.parent }) }) ?? []
        // New items of the store that this device has no record of, in runs of one folder's,
        // each run made in one transaction (`addFromRemote(run:)`); the rest one at a time.
        let plain = plainAdditions(puts, moves)
        var run: [(key: String, info: ObjectInfo)] = []
        var runAsked: UInt64?
        func flush() {
            guard !run.isEmpty else { return }
            retry += addFromRemote(run: run, askedAt: runAsked)
            run.removeAll()
            runAsked = nil
        }
        for c in puts + deletes {
            if let info = c.info, plain.contains(KeyBytes(c.key)) {
                if let last = run.last, Self.parentFolder(last.key) != Self.parentFolder(c.key) || run.count >= Self.runSize { flush() }
                run.append((c.key, info))
                // The earliest question of the run stands for all of it.
                runAsked = [runAsked, c.askedAt].compactMap { $0 }.min()
                continue
            }
            flush()
            do {
                let done: Bool
                if let info = c.info, let from = moves.items[KeyBytes(c.key)] {
                    done = try applyRemoteMove(from, to: c.key, info, askedAt: c.askedAt)
                } else {
                    done = try c.info.map { try applyRemotePut(c.key, $0, before: c.recordedBefore, askedAt: c.askedAt) }
                        ?? applyRemoteDelete(c.key, before: c.recordedBefore, askedAt: c.askedAt)
                    if done, let old = moves.pinsFrom[KeyBytes(c.key)], inodes.locked({ t in t[old]?.rec.pinned }) == true,
                       let new = try state.read({ try $0.entries(remoteKey: c.key).first?.ino }) {
                        try setPinned(new, true)
                    }
                }
                if !done { retry.append(c.key) }
            } catch {
                logger.warning("could not apply the store's change of \(c.key): \(error)")
                retry.append(c.key)
            }
        }
        flush()
        removeFoldersGoneWithTheirFiles(emptying)
        return retry
    }

    /// New items in one run of `addFromRemote(run:)` at most.
    public static let runSize = 500

    /// The record of a new item of the store (a placeholder, for a file of bytes), as it is
    /// uploaded: what one item's addition and a run of them both make.
    static func remoteRecord(ino: UInt64, type: UInt32, meta: ObjectMetadata, size: Int64, now: Int64) -> InodeRecord {
        let isFile = type == UInt32(S_IFREG)
        var rec = InodeRecord(ino: ino, type: type, perm: meta.mode & 0o7777, uid: meta.uid, gid: meta.gid,
                              size: isFile ? size : 0, atimeNs: meta.mtimeNs, mtimeNs: meta.mtimeNs, ctimeNs: now,
                              rdev: meta.rdev, target: meta.target.map { [UInt8]($0) },
                              present: !isFile || size == 0)
        rec.contentGen = 1
        rec.metaGen = 1
        return rec
    }

    /// The folder `key` is in, as a prefix: a folder's key ("a/b/") is in "a/", as a file's is.
    static func parentFolder(_ key: String) -> String {
        StoreKey.folder(of: key.hasSuffix("/") ? String(key.dropLast()) : key)
    }

    /// Of `puts`, the keys of items new here: not moves, not recorded when the store was asked,
    /// with no entry and no pending delete (asked in one read, where `applyRemotePut` asks
    /// twice for each), a valid key. A mount again brought 100,000 such from its listing at
    /// about 600 a second, one transaction each; a fresh device's import took 10 s.
    private func plainAdditions(_ puts: [RemoteChange], _ moves: RemoteMoves) -> Set<KeyBytes> {
        let candidates = puts.filter {
            $0.recordedBefore == nil && moves.items[KeyBytes($0.key)] == nil && moves.pinsFrom[KeyBytes($0.key)] == nil
                && (try? StoreKey.validate($0.key)) != nil
        }
        guard candidates.count > 1 else { return [] }
        guard let recorded = try? state.read({ tx in Set(try tx.recordedKeys(among: candidates.map(\.key)).map(KeyBytes.init)) })
        else { return [] }
        return Set(candidates.lazy.map { KeyBytes($0.key) }.filter { !recorded.contains($0) })
    }

    /// Makes the items of `run` (new here, all in one folder: `plainAdditions`) in one
    /// transaction under one claim of their folder; what cannot be made so (a name taken
    /// here, a folder changed meanwhile) goes as `addFromRemote` takes it. Returns the keys to
    /// try again later.
    private func addFromRemote(run: [(key: String, info: ObjectInfo)], askedAt: UInt64?) -> [String] {
        var slow: [(key: String, info: ObjectInfo)] = []
        var retry: [String] = []
        var made: [(ino: UInt64, name: [UInt8], isFile: Bool, size: Int64)] = []
        var parent: UInt64?
        do {
            guard let dir = try remoteParent(of: run[0].key, StoreKey.segments(run[0].key).parts) else { return run.map(\.key) }
            parent = dir
            let c = try claim([dir], .write)
            defer { coordinator.release(c) }
            try inodes.locked { t in
                let folder = try t.directory(dir)
                guard folder.nlink > 0 else {
                    retry = run.map(\.key)
                    return
                }
                let now = nowNanos()
                var rows: [(rec: InodeRecord, name: [UInt8], info: ObjectInfo, xattrs: [[UInt8]: [UInt8]])] = []
                var names = Set<[UInt8]>()
                var next = t.nextIno
                for (key, info) in run {
                    let (parts, isDirKey) = StoreKey.segments(key)
                    let name = Array(parts.last!.utf8)
                    guard folder.children[name] == nil, names.insert(name).inserted else {
                        slow.append((key, info))
                        continue
                    }
                    let type = (isDirKey ? ObjectKind.directory : info.metadata.kind).fileType
                    rows.append((Self.remoteRecord(ino: next, type: type, meta: info.metadata, size: info.size, now: now),
                                 name, info, info.metadata.localXattrs))
                    next += 1
                }
                // Asked again here, under the folder's claim, as `applyRemotePut` asks each just
                // before it makes it: a key this device recorded since the first read waits.
                var since = try state.read { tx in Set(try tx.recordedKeys(among: rows.map(\.info.key)).map(KeyBytes.init)) }
                // And one this device wrote since the store was asked (a tombstone made and gone).
                for r in rows where writtenHere(since: askedAt, r.info.key) { since.insert(KeyBytes(r.info.key)) }
                retry += rows.filter { since.contains(KeyBytes($0.info.key)) }.map(\.info.key)
                rows.removeAll { since.contains(KeyBytes($0.info.key)) }
                for r in rows where r.rec.type == UInt32(S_IFREG) && r.rec.size == 0 { try cache.createEmpty(r.rec.ino) }
                try persistNow { tx in
                    for r in rows {
                        try tx.insertUploaded(r.rec)
                        try tx.insertEntry(parent: dir, name: r.name, ino: r.rec.ino, remoteKey: r.info.key,
                                           remoteVersion: r.info.version, remoteTag: r.info.contentTag,
                                           remoteDigest: r.info.metadata.sha256, remoteFileID: r.info.metadata.fileID)
                        for (k, v) in r.xattrs { try tx.setXattr(r.rec.ino, name: k, value: v) }
                    }
                }
                for r in rows {
                    t.attach(r.rec, in: folder, name: r.name).xattrs = r.xattrs
                    made.append((r.rec.ino, r.name, r.rec.type == UInt32(S_IFREG), r.rec.size))
                }
            }
        } catch {
            logger.warning("could not apply the store's changes in the folder of \(run[0].key): \(error)")
            return run.map(\.key)
        }
        if let parent {
            for m in made { invalidateKernelEntry(parent, m.name) }
            let pinned = (try? isPinned(parent)) ?? false
            for m in made {
                emit(.changedRemotely, m.ino)
                if pinned && m.isFile && m.size > 0 { try? materializer.start(m.ino) }
            }
        }
        for (key, info) in slow {
            do { if !(try applyRemotePut(key, info, before: nil, askedAt: askedAt)) { retry.append(key) } } catch {
                logger.warning("could not apply the store's change of \(key): \(error)")
                retry.append(key)
            }
        }
        return retry
    }

    /// A folder another tool made has no marker in the store: it is there only as the prefix of
    /// its files' keys, and here it is a folder with no key. When the store's changes leave one
    /// empty here (its files deleted or moved elsewhere, a folder renamed there), it is gone from
    /// the store too, and goes here; so do its parents that it leaves empty the same way. One
    /// changed here (a new name, mode or xattr: it is on its way up as a folder) stays.
    private func removeFoldersGoneWithTheirFiles(_ candidates: Set<UInt64>) {
        var queue = Array(candidates)
        while let dir = queue.popLast() {
            guard dir != rootIno, inodes.locked({ t in t[dir].map { $0.isDirectory && $0.children.isEmpty } }) == true,
                  let e = try? state.read({ tx -> EntryRecord? in
                      guard let e = try tx.entries(of: dir).first, e.remoteKey == nil else { return nil }
                      return try tx.isChangedHere(dir) ? nil : e
                  }) else { continue }
            let gone = events.hasSubscribers ? pathBytes(of: dir) : nil
            guard let c = try? claim([e.parent, dir], .delete) else { continue }
            let removed: Bool = {
                defer { coordinator.release(c) }
                return (try? inodes.locked { t -> Bool in
                    guard let parent = t[e.parent], parent.children[e.name] == dir, let n = t[dir], n.isDirectory,
                          n.children.isEmpty else { return false }
                    let now = nowNanos()
                    parent.rec.mtimeNs = now
                    parent.rec.ctimeNs = now
                    let parentRec = parent.rec
                    var changed = false
                    try persistNow { tx in
                        // Checked again where a change recorded meanwhile would be seen.
                        guard try tx.entries(of: dir).first?.remoteKey == nil, !(try tx.isChangedHere(dir)) else {
                            changed = true
                            return
                        }
                        try tx.removeEntry(parent: e.parent, name: e.name)
                        try tx.upsert(parentRec)
                    }
                    if changed { return false }
                    parent.children[e.name] = nil
                    n.nlink = 0
                    parent.nlink -= 1
                    reapIfUnreferenced(n, t)
                    return true
                }) ?? false
            }()
            guard removed else { continue }
            logger.info("\(pathBytes(of: e.parent).map { Self.join($0, e.name) }.map { String(decoding: $0, as: UTF8.self) } ?? "a folder") is gone from the store with its files (it had no folder marker there): removed here")
            invalidateKernelEntry(e.parent, e.name)
            if let gone { emit(.deleted, dir, path: gone) }
            queue.append(e.parent)
        }
    }

    /// Moves the item of entry `e` (whose key the store deleted) to `key`, where the store now
    /// has it as `info`, then takes `info`'s metadata, and its bytes when they are not the ones
    /// here (an item paired by its id, moved and edited at once): bytes that are the same are
    /// not downloaded again. An item already there (its folder moved first) only takes the new key.
    private func applyRemoteMove(_ e: EntryRecord, to key: String, _ info: ObjectInfo, askedAt: UInt64?) throws -> Bool {
        if writtenHere(since: askedAt, key) || e.remoteKey.map({ writtenHere(since: askedAt, $0) }) == true { return false }
        // What the entry records of its bytes: the store's words for them at the new key when
        // they are the same, else the old ones, so that `updateFromRemote` takes the new bytes.
        let same = e.holdsTheBytes(of: info)
        let (tag, digest) = same ? (info.contentTag, info.metadata.sha256) : (e.remoteTag, e.remoteDigest)
        let (parts, _) = StoreKey.segments(key)
        guard let parent = try remoteParent(of: key, parts) else { return false }
        let name = Array(parts.last!.utf8)
        let ino = e.ino
        let from = events.hasSubscribers ? pathBytes(of: e.parent).map { Self.join($0, e.name) } : nil
        let c = try claim([e.parent, parent, ino], .move)
        let moved: Bool = try {
            defer { coordinator.release(c) }
            return try inodes.locked { t in
                guard let fromDir = t[e.parent], fromDir.children[e.name] == ino, let n = t[ino], let toDir = t[parent],
                      toDir.isDirectory, toDir.nlink > 0 else { return false }
                let here = toDir.children[name]
                if here != nil && here != ino { return false }
                if here == nil, n.isDirectory, t.isInside(parent, ino) { return false }  // not into itself
                let now = nowNanos()
                var superseded = false
                try persistNow { tx in
                    // Checked again in the transaction, where this device's uploader's record would be seen.
                    guard try tx.entries(of: ino).first(where: { $0.id == e.id })?.remoteVersion == e.remoteVersion else {
                        superseded = true
                        return
                    }
                    if here == nil {
                        try tx.moveEntry(parent: e.parent, name: e.name, toParent: parent, toName: name)
                        for d in [fromDir, toDir] { d.rec.mtimeNs = now; d.rec.ctimeNs = now; try tx.upsert(d.rec) }
                    }
                    // At the new key, still at the old version: `updateFromRemote` records the new one
                    // with its metadata (a crash in between is the same move, seen again).
                    try tx.setRemote(entryID: e.id, key: key, version: e.remoteVersion, tag: tag, digest: digest)
                }
                if superseded || here != nil { return !superseded }
                fromDir.children[e.name] = nil
                toDir.children[name] = ino
                if n.isDirectory {
                    n.parent = parent
                    if parent != e.parent { fromDir.nlink -= 1; toDir.nlink += 1 }
                }
                return true
            }
        }()
        guard moved else { return false }
        if e.parent != parent || e.name != name {
            invalidateKernelEntry(e.parent, e.name)
            invalidateKernelEntry(parent, name)
            if let from { emit(.moved, ino, path: pathBytes(of: parent).map { Self.join($0, name) }, from: from) }
            logger.info("\(e.remoteKey ?? "?") moved to \(key) in the store: moved here")
        }
        var now = e
        now.parent = parent; now.name = name; now.remoteKey = key
        now.remoteTag = tag; now.remoteDigest = digest
        return try updateFromRemote(now, info)
    }

    /// The folder that holds `key`'s item, with the folders on the way made as needed; nil
    /// when a file stands where a folder would be, or a folder changed meanwhile (tried again
    /// at the next poll).
    private func remoteParent(of key: String, _ parts: [String]) throws -> UInt64? {
        var parent = rootIno
        for seg in parts.dropLast() {
            let name = Array(seg.utf8)
            let existing = try inodes.locked { t in try t.directory(parent).children[name] }
            if let existing {
                guard inodes.locked({ t in t[existing]?.isDirectory ?? false }) else {
                    // Said once: the key waits at every poll (objects `a` and `a/b` in the store
                    // said it 3,200 times in 33 minutes).
                    sayOnce(key, "not adding \(key) yet: a file here stands where its folder would be")
                    return nil
                }
                parent = existing
            } else {
                guard let made = try makeRemoteNode(in: parent, name: name, type: UInt32(S_IFDIR),
                                                    meta: ObjectMetadata(kind: .directory, mode: 0o755, uid: getuid(),
                                                                         gid: getgid(), mtimeNs: nowNanos()),
                                                    size: 0, remote: nil) else { return nil }
                parent = made
            }
        }
        return parent
    }

    /// Logs `message` of `key` the first time it is said.
    func sayOnce(_ key: String, _ message: String) {
        let first = saidOfKeys.withLock { said in
            if said.count > 10_000 { said.removeAll() }
            return said.insert(key + "\u{0}" + message).inserted
        }
        if first { logger.info("\(message)") }
    }

    // MARK: - Additions and updates

    private func applyRemotePut(_ key: String, _ info: ObjectInfo, before: String?, askedAt: UInt64?) throws -> Bool {
        let (known, doomed) = try state.read { tx in (try tx.entries(remoteKey: key), try tx.hasTombstone(key: key)) }
        // Written here since the store was asked (read after the rows: a write recorded since
        // was noted before it was): what the store said is older than what this device did.
        // A folder renamed away here came back, empty, from a listing taken just before its
        // old marker's delete (its tombstone gone by the time this ran).
        if writtenHere(since: askedAt, key) { return false }
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
        guard let parent = try remoteParent(of: key, parts) else { return false }
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
            sayOnce(key, "not adding \(key) from the store yet: a local item has that name")
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
            return try attachFromRemote(t, in: dir, name: name, type: type, meta: meta, size: size) { tx, ino in
                try tx.insertEntry(parent: parent, name: name, ino: ino, remoteKey: remote?.key,
                                   remoteVersion: remote?.version, remoteTag: remote?.contentTag,
                                   remoteDigest: remote?.metadata.sha256, remoteFileID: remote?.metadata.fileID)
            }
        }
        if ino != nil { invalidateKernelEntry(parent, name) }
        return ino
    }

    /// A new item as the store has it (`meta`, `size`; uploaded as it is: nothing of it is
    /// this device's to send), named `name` in `dir`; its name's row is `entry`'s to write, in
    /// the same transaction as the item's. Under the inode table's lock, the folder's claim held.
    private func attachFromRemote(_ t: Inodes, in dir: Node, name: [UInt8], type: UInt32, meta: ObjectMetadata, size: Int64,
                                  entry: (StateTransaction, UInt64) throws -> Void) throws -> UInt64 {
        let ino = t.nextIno
        let rec = Self.remoteRecord(ino: ino, type: type, meta: meta, size: size, now: nowNanos())
        if type == UInt32(S_IFREG) && size == 0 { try cache.createEmpty(ino) }
        let xattrs = meta.localXattrs
        try persistNow { tx in
            try tx.upsert(rec)
            try tx.markUploaded(ino, contentGen: 1, metaGen: 1)
            try entry(tx, ino)
            try tx.replaceXattrs(ino, xattrs)
        }
        t.attach(rec, in: dir, name: name).xattrs = xattrs
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
        if contentChanged {
            let (linked, open) = inodes.locked { t in ((t[ino]?.nlink ?? 1) > 1, t.isOpen(ino)) }
            if linked { return try splitLinkFromRemote(e, info) }
            // A reader keeps the version it opened until it closes.
            if open {
                waitingForClose.withLock { _ = $0.insert(ino) }
                return false
            }
        }
        let c = try claim([ino], .replace)
        var refetch = false, accessChanged = false
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
                    t.replacedContent(n)
                }
                let m = info.metadata
                n.rec.ctimeNs = now
                if contentChanged || !keepLocalMeta { n.rec.mtimeNs = m.mtimeNs }
                if !keepLocalMeta && n.isDirectory {
                    accessChanged = n.rec.perm != m.mode & 0o7777 || n.rec.uid != m.uid || n.rec.gid != m.gid
                }
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
                // The same bytes at another key or version (moved, or new metadata): a download
                // under way reads them there now (the old version may be gone: a bucket without versions).
                if isFile && !contentChanged, let old = e.remoteVersion {
                    materializer.follow(ino, from: old, to: info.key, version: info.version)
                }
                return true
            }
        }()
        guard applied else { return false }
        if accessChanged { folderAccessChanged(ino) }
        invalidateKernelCache(ino)
        emit(.changedRemotely, ino)
        if refetch || (contentChanged && info.size > 0 && (try? isPinned(ino)) == true) {
            try? materializer.start(ino)
        }
        return true
    }

    /// One name of a hard link got new bytes in the store. The store holds each name of a link
    /// as a file of its own, and so does every other device: one of them wrote this one. The
    /// name leaves the link here and becomes a file of its own with the store's version (a
    /// placeholder); the link's other names keep what they hold, as they do in the store. (Left
    /// in the link, the name gave the link the new size while its bytes came from another name's
    /// older version: every read of it failed.)
    private func splitLinkFromRemote(_ e: EntryRecord, _ info: ObjectInfo) throws -> Bool {
        let c = try claim([e.parent, e.ino], .write)
        defer { coordinator.release(c) }
        let made: UInt64? = try inodes.locked { t in
            guard let dir = t[e.parent], dir.children[e.name] == e.ino, let old = t[e.ino], old.nlink > 1,
                  !old.unpersisted, old.writers == 0 else { return nil }
            // Uploaded by this device since the store was asked: not replaced by what was read.
            let recorded = try state.read { try $0.entries(of: e.ino).first(where: { $0.id == e.id })?.remoteVersion }
            guard recorded == e.remoteVersion else { return nil }
            old.rec.ctimeNs = nowNanos()
            let oldRec = old.rec
            // The name goes to the new item (`attach`), and leaves the link.
            let ino = try attachFromRemote(t, in: dir, name: e.name, type: UInt32(S_IFREG), meta: info.metadata, size: info.size) { tx, ino in
                try tx.relinkEntry(id: e.id, to: ino)
                try tx.recordRemote(entryID: e.id, key: info.key, info)
                try tx.upsert(oldRec)
            }
            old.nlink -= 1
            return ino
        }
        guard let ino = made else { return false }
        logger.info("\(info.key) changed in the store: it is a file of its own here now, no longer a hard link of inode \(e.ino)")
        invalidateKernelEntry(e.parent, e.name)
        invalidateKernelCache(e.ino)
        emit(.changedRemotely, ino)
        if info.size > 0, (try? isPinned(ino)) == true { try? materializer.start(ino) }
        return true
    }

    /// Whether this device wrote `key` in the store after a question asked at `askedAt`
    /// (`StoreWrites`); call after reading what it records of the key.
    func writtenHere(since askedAt: UInt64?, _ key: String) -> Bool {
        guard let askedAt, let writes = uploader?.writes else { return false }
        return writes.writtenSince(askedAt, key)
    }

    // MARK: - Removals

    /// Tries in a row, a poll apart, in which a folder deleted in the store did not empty before
    /// it stays (and goes up again).
    static let emptyingTries = 3

    /// How many items folder `ino` holds, when each is an item of the store that nothing here
    /// changed (what it holds, it holds by the same rule when its own delete comes); else nil.
    private func heldOnlyWhatTheStoreHas(_ ino: UInt64) throws -> Int? {
        try state.read { tx in
            let children = try tx.children(of: ino)
            for child in children {
                guard child.remoteKey != nil else { return nil }
                if try tx.isChangedHere(child.ino) { return nil }
            }
            return children.count
        }
    }

    /// `before`: the version recorded for `key` when the store said it was gone (see RemoteChange).
    private func applyRemoteDelete(_ key: String, before: String?, askedAt: UInt64? = nil) throws -> Bool {
        guard let e = try state.read({ try $0.entries(remoteKey: key).first }) else { return true }
        if writtenHere(since: askedAt, key) { return false }
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
        if !changedHere, isDir, hasChildren, let held = try heldOnlyWhatTheStoreHas(ino) {
            // What it holds is in the store, unchanged: their own deletes (or moves) come after
            // the folder's (a move elsewhere copies and deletes the folder's key first). Tried
            // again at each poll while it empties; when it stops emptying (what it holds stays in
            // the store: the other device did not know of it), it stays, as below.
            let waits = foldersEmptying.withLock { w -> Bool in
                let idle = w[ino].map { held < $0.held ? 0 : $0.idle + 1 } ?? 0
                w[ino] = (held, idle)
                return idle < Self.emptyingTries
            }
            if waits { return false }
        }
        foldersEmptying.withLock { _ = $0.removeValue(forKey: ino) }
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
