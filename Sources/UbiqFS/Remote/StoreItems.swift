import Foundation
import UbiqCoordinator
import UbiqState
import UbiqStore
import UbiqSync

/// The store's changes made here (`StoreItemHost`): the sync engine's `RemoteApplier` decides
/// which change wins and asks for it; each of these claims the items it touches through the
/// Coordinator, records its rows in the transaction that checks they are still as read, and
/// drops what the kernel cached of them.
extension FileSystem: StoreItemHost {
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

    private func facts(of n: Node) -> StoreItemFacts {
        var f = StoreItemFacts(ino: n.rec.ino, type: n.rec.type)
        f.hasChildren = n.isDirectory && !n.children.isEmpty
        f.isPlaceholder = n.isRegular && !n.rec.present
        f.linked = !n.isDirectory && n.nlink > 1
        f.isOpen = n.opens > 0
        f.pinned = n.rec.pinned
        return f
    }

    public func facts(_ ino: UInt64) -> StoreItemFacts? {
        inodes.locked { t in t[ino].map { facts(of: $0) } }
    }

    public func child(of dir: UInt64, named name: [UInt8]) throws -> StoreItemFacts? {
        try inodes.locked { t in
            guard let ino = try t.directory(dir).children[name] else { return nil }
            return try facts(of: t.node(ino))
        }
    }

    public func makeItems(in dir: UInt64, _ run: [ObjectInfo], leaving: ([ObjectInfo]) throws -> Set<KeyBytes>) throws -> StoreItemRun {
        var out = StoreItemRun()
        var made: [[UInt8]] = []
        var madeInfos: [ObjectInfo] = []
        let c = try claim([dir], .write)
        try {
            defer { coordinator.release(c) }
            try inodes.locked { t in
                let folder = try t.directory(dir)
                guard folder.nlink > 0 else {
                    out.retry = run.map(\.key)
                    return
                }
                let now = nowNanos()
                var rows: [(rec: InodeRecord, name: [UInt8], info: ObjectInfo, xattrs: [[UInt8]: [UInt8]])] = []
                var names = Set<[UInt8]>()
                var next = t.nextIno
                for info in run {
                    let (parts, isDirKey) = StoreKey.segments(info.key)
                    let name = Array(parts.last!.utf8)
                    guard folder.children[name] == nil, names.insert(name).inserted else {
                        out.oneByOne.append(info)
                        continue
                    }
                    let type = (isDirKey ? ObjectKind.directory : info.metadata.kind).fileType
                    rows.append((Self.remoteRecord(ino: next, type: type, meta: info.metadata, size: info.size, now: now),
                                 name, info, info.metadata.localXattrs))
                    next += 1
                }
                let left = try leaving(rows.map(\.info))
                out.retry += rows.filter { left.contains(KeyBytes($0.info.key)) }.map(\.info.key)
                rows.removeAll { left.contains(KeyBytes($0.info.key)) }
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
                    out.made.append((r.rec.ino, r.rec.size))
                    made.append(r.name)
                    madeInfos.append(r.info)
                }
            }
        }()
        for name in made { invalidateKernelEntry(dir, name) }
        for m in out.made { emit(.changedRemotely, m.ino) }
        for (name, info) in zip(made, madeInfos) { announceIfConflictCopy(in: dir, name: name, info.metadata) }
        return out
    }

    public func makeItem(in parent: UInt64, name: [UInt8], type: UInt32, meta: ObjectMetadata, size: Int64,
                         remote: ObjectInfo?) throws -> UInt64? {
        let c = try claim([parent], .write)
        let ino: UInt64? = try {
            defer { coordinator.release(c) }
            return try inodes.locked { t in
                let dir = try t.directory(parent)
                if dir.children[name] != nil || dir.nlink == 0 { return nil }
                return try attachFromRemote(t, in: dir, name: name, type: type, meta: meta, size: size) { tx, ino in
                    try tx.insertEntry(parent: parent, name: name, ino: ino, remoteKey: remote?.key,
                                       remoteVersion: remote?.version, remoteTag: remote?.contentTag,
                                       remoteDigest: remote?.metadata.sha256, remoteFileID: remote?.metadata.fileID)
                }
            }
        }()
        guard let ino else { return nil }
        invalidateKernelEntry(parent, name)
        if remote != nil {
            emit(.changedRemotely, ino)
            announceIfConflictCopy(in: parent, name: name, meta)
        }
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

    public func record(_ e: EntryRecord, as info: ObjectInfo) throws {
        try persistNow { tx in try tx.recordRemote(entryID: e.id, key: info.key, info) }
    }

    public func moveItem(_ e: EntryRecord, to parent: UInt64, name: [UInt8], key: String, tag: String?, digest: String?) throws -> Bool {
        let ino = e.ino
        let from = events.wants(.moved) ? pathBytes(of: e.parent).map { Self.join($0, e.name) } : nil
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
                    // At the new key, still at the old version: the update records the new one
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
        }
        return true
    }

    public func updateItem(_ e: EntryRecord, to info: ObjectInfo, contentChanged: Bool, keepLocalMeta: Bool) throws -> Bool? {
        let ino = e.ino
        let c = try claim([ino], .replace)
        var wasLocal = false, accessChanged = false
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
                    wasLocal = n.rec.present || materializer.localBytes(ino) != nil || n.rec.pinned
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
                if n.isRegular && !contentChanged, let old = e.remoteVersion {
                    materializer.follow(ino, from: old, to: info.key, version: info.version)
                }
                return true
            }
        }()
        guard applied else { return nil }
        if accessChanged { folderAccessChanged(ino) }
        invalidateKernelCache(ino)
        emit(.changedRemotely, ino)
        return wasLocal
    }

    public func splitLink(_ e: EntryRecord, to info: ObjectInfo) throws -> UInt64? {
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
        guard let ino = made else { return nil }
        invalidateKernelEntry(e.parent, e.name)
        invalidateKernelCache(e.ino)
        emit(.changedRemotely, ino)
        return ino
    }

    public func updateAtLastClose(_ ino: UInt64) {
        waitingForClose.withLock { _ = $0.insert(ino) }
    }

    public func sendAgain(_ e: EntryRecord) throws {
        try persistNow { tx in
            try tx.setRemote(entryID: e.id, key: nil, version: nil)
            try tx.enqueue(e.ino)
        }
        kickUploader()
    }

    public func removeItem(_ e: EntryRecord, unlessRecordedSince before: String?) throws -> Bool {
        let ino = e.ino
        let gone = events.wants(.deleted) ? pathBytes(of: ino) : nil
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
                    guard let now = try tx.entries(of: ino).first(where: { $0.id == e.id }), now.remoteVersion == before,
                          let key = e.remoteKey, now.remoteKey?.sameBytes(key) == true else {
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
            invalidateKernelEntry(e.parent, e.name)
            if let gone { emit(.deleted, ino, path: gone) }
        }
        return removed
    }

    public func removeEmptyFolder(_ dir: UInt64, if still: (StateTransaction, UInt64) throws -> Bool) -> UInt64? {
        guard let e = try? state.read({ try $0.entries(of: dir).first }) else { return nil }
        let gone = events.wants(.deleted) ? pathBytes(of: dir) : nil
        guard let c = try? claim([e.parent, dir], .delete) else { return nil }
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
                    guard try still(tx, dir) else {
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
        guard removed else { return nil }
        logger.info("\(pathBytes(of: e.parent).map { Self.join($0, e.name) }.map { String(decoding: $0, as: UTF8.self) } ?? "a folder") is gone from the store with its files (it had no folder marker there): removed here")
        invalidateKernelEntry(e.parent, e.name)
        if let gone { emit(.deleted, dir, path: gone) }
        return e.parent
    }
}
