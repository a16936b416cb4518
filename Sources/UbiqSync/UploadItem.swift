import Foundation
import Synchronization
import Logging
import UbiqCoordinator
import UbiqState
import UbiqStore

// One item's upload: its bytes, a move or a metadata change, each conditional on the version
// the edit started from; metadata merged onto a newer version; rename cycles broken.
extension Uploader {
    /// What goes up with `entry` of item `s`: its id is the one the entry records, or a new
    /// one for an entry the store never had (a new item, or a new hard link to one).
    func metadata(_ s: Snapshot, entry: EntryRecord, generation: Int64) -> ObjectMetadata {
        var x: [String: Data] = [:]
        for (k, v) in s.xattrs {
            if let name = String(validating: k, as: UTF8.self) { x[name] = Data(v) }
        }
        return ObjectMetadata(kind: Self.kind(s.rec.type), mode: s.rec.perm, uid: s.rec.uid, gid: s.rec.gid,
                              mtimeNs: s.rec.mtimeNs, rdev: s.rec.rdev, target: s.rec.target.map { Data($0) },
                              xattrs: x, origin: origin(s.rec.ino, generation), device: deviceName,
                              fileID: entry.remoteFileID ?? ObjectMetadata.newFileID())
    }

    func origin(_ ino: UInt64, _ generation: Int64) -> String { "\(deviceID):\(ino):\(generation)" }

    static func kind(_ type: UInt32) -> ObjectKind {
        switch type {
        case S_IFDIR: return .directory
        case S_IFLNK: return .symlink
        case S_IFIFO: return .fifo
        case S_IFSOCK: return .socket
        case S_IFCHR: return .charDevice
        case S_IFBLK: return .blockDevice
        default: return .file
        }
    }

    func trace(_ what: @autoclosure () -> String) {
        if tracing { logger.info("upload trace: \(what())") }
    }

    /// `keys`: the only keys it may touch, when it goes beside other items (`uploadSideBySide`);
    /// an item that came to need others since (renamed meanwhile, or now a folder) goes later.
    func upload(_ ino: UInt64, keys: Set<KeyBytes>? = nil) throws -> Outcome {
        guard let first = try snapshot(ino) else { return .done }
        if first.entries.isEmpty { return .done }  // removed: its tombstones do the rest
        if let keys, !(Self.keys(of: first)?.isSubset(of: keys) ?? false) { return .deferred }
        let pass = Pass(ino, first)
        defer { pass.end(coordinator) }
        for (entry, path) in first.entries {
            guard let path else {
                return .localOnly("a name on the way to inode \(ino) is not valid UTF-8: kept on this device only")
            }
            let key = pass.isDir ? path + "/" : path
            if entry.remoteKey == nil || (!pass.isDir && pass.contentDirty) {
                if pass.isRegular && pass.staged == nil && pass.s.rec.present, let outcome = try stage(pass) { return outcome }
                // A placeholder whose content is in the store already is a move or a metadata
                // change (below); anything else goes up.
                if !(pass.isRegular && !pass.s.rec.present && entry.remoteKey != nil) {
                    if let outcome = try put(entry, at: key, pass) { return outcome }
                    continue
                }
            }
            guard let oldKey = entry.remoteKey, let oldVersion = entry.remoteVersion else { continue }
            if !oldKey.sameBytes(key) {
                if let outcome = try move(entry, from: oldKey, version: oldVersion, to: key, pass) { return outcome }
            } else if pass.metaDirty {
                if let outcome = try updateMetadata(entry, at: key, version: oldVersion, pass) { return outcome }
            }
        }
        try state.write { try $0.markUploaded(ino, contentGen: pass.s.rec.contentGen, metaGen: pass.s.rec.metaGen) }
        return pass.setAside.isEmpty ? .done : .setAside(pass.setAside.joined(separator: ", "))
    }

    /// One upload of an item, from step to step: its snapshot (taken again under the upload
    /// claim when its bytes are staged), the staged bytes, the claim held through a put of the
    /// cache file itself, and other devices' versions kept as conflict copies on the way.
    final class Pass {
        let ino: UInt64
        var s: Snapshot
        let isDir: Bool, isRegular: Bool, contentDirty: Bool, metaDirty: Bool
        var staged: URL?
        var stagedIsCopy = true
        /// Held through the put when there was no room to stage a copy (see `stage`).
        var heldClaim: Claim?
        var setAside: [String] = []

        init(_ ino: UInt64, _ s: Snapshot) {
            self.ino = ino; self.s = s
            isDir = s.rec.type == UInt32(S_IFDIR)
            isRegular = s.rec.type == UInt32(S_IFREG)
            contentDirty = s.rec.contentGen > s.upload.uploadedContentGen
            metaDirty = s.rec.metaGen > s.upload.uploadedMetaGen
        }


        func end(_ coordinator: Coordinator) {
            if let staged, stagedIsCopy { unlink(staged.path) }
            if let heldClaim { coordinator.release(heldClaim) }
        }
    }

    /// The item's bytes staged for the put, under an upload claim: writers wait, readers go on.
    /// Nil, or what the upload comes to (the item gone, a claim or the disk failing).
    private func stage(_ pass: Pass) throws -> Outcome? {
        let ino = pass.ino
        let claim: Claim
        do { claim = try coordinator.claim(ino, .upload) } catch { return .retry("\(error)") }
        var keep = false
        defer { if !keep { coordinator.release(claim) } }
        guard let fresh = try snapshot(ino) else { return .done }
        pass.s = fresh
        // The store gets only bytes this device cannot lose: a close commits without
        // syncing, so what it committed is made durable first (the record of it too).
        do { try cache.sync(ino) } catch { return .retry("\(error)") }
        state.syncToDisk()
        do {
            pass.staged = try cache.stage(ino, generation: pass.s.rec.contentGen)
        } catch let e as LocalWriteError where e.errno == ENOSPC || e.errno == EDQUOT {
            // No room for a copy: send the cache file itself, and keep writers
            // out until it is sent (readers go on).
            logger.info("no room to stage inode \(ino) for upload; uploading it in place")
            pass.staged = URL(fileURLWithPath: cache.path(ino))
            pass.stagedIsCopy = false
            pass.heldClaim = claim
            keep = true
        }
        return nil
    }

    /// `entry` put at `key`, conditional on the version it was edited from (else on the key
    /// being free). Nil when it went up, or what the upload comes to.
    private func put(_ entry: EntryRecord, at key: String, _ pass: Pass) throws -> Outcome? {
        let (ino, s, store, writes) = (pass.ino, pass.s, self.store, self.writes)
        let condition: WriteCondition = (entry.remoteKey?.sameBytes(key) == true && entry.remoteVersion != nil)
            ? .ifMatch(entry.remoteVersion!) : .ifAbsent
        // The digest of the staged bytes goes with them (checked by every download).
        var described = metadata(s, entry: entry, generation: s.rec.contentGen)
        if let staged = pass.staged {
            do { described.sha256 = try ContentDigest.of(path: staged.path) } catch { return .retry("\(error)") }
        }
        let meta = described
        let source = pass.staged
        let total = max(1, s.rec.size)
        let progress = self.progress
        func send(_ condition: WriteCondition) throws -> ObjectInfo {
            progress.set(ino, 0)
            let report: @Sendable (Int64) -> Void = { sent in progress.set(ino, Int(min(99, sent * 100 / total))) }
            trace("put \(key) \(condition) ino \(ino) gen \(s.rec.contentGen)")
            return try runBlocking {
                try await writes.writing(key) { try await store.put(key, contentsOf: source, metadata: meta, condition: condition, progress: report) }
            }
        }
        // Should the answer never come and the item be removed, the key is checked then.
        if entry.remoteKey?.sameBytes(key) != true { try state.write { try $0.markSent(ino, key: key) } }
        let info: ObjectInfo
        do {
            info = try send(condition)
        } catch StoreError.preconditionFailed(_, let current) {
            switch try overTaken(entry, at: key, condition: condition, current: current, pass, again: send,
                                 startOver: { ($0 as? StoreError)?.isPreconditionFailed == true }) {
            case .wrote(let written): info = written
            case .done(let outcome): return outcome
            }
        }
        try removeOld(entry, newKey: key, tombstone: try recordAt(entry, key: key, info))
        return nil
    }

    /// `entry` moved in the store from `oldKey` to `key`: a server-side copy, then the old key
    /// dropped; no content leaves the store. Nil when it moved, or what the upload comes to.
    private func move(_ entry: EntryRecord, from oldKey: String, version oldVersion: String, to key: String,
                      _ pass: Pass) throws -> Outcome? {
        let (ino, s, store, writes) = (pass.ino, pass.s, self.store, self.writes)
        let meta = metadata(s, entry: entry, generation: s.rec.contentGen)
        func copy(_ condition: WriteCondition) throws -> ObjectInfo {
            trace("copy \(oldKey)@\(oldVersion) to \(key) \(condition) ino \(ino)")
            return try runBlocking {
                try await writes.writing(oldKey, key) { try await store.copy(from: oldKey, version: oldVersion, to: key, metadata: meta, condition: condition) }
            }
        }
        try state.write { try $0.markSent(ino, key: key) }
        let info: ObjectInfo
        do {
            info = try copy(.ifAbsent)
        } catch StoreError.notFound where !pass.isRegular || s.rec.present {
            // What it moved from is gone from the store (deleted, or written over, on
            // another device meanwhile; a store without old versions cannot copy it):
            // what is here goes up anew under the new name, and the old key is left alone.
            logger.info("\(oldKey) is gone from the store: inode \(ino) goes up anew as \(key)")
            try state.write { try $0.setRemote(entryID: entry.id, key: nil, version: nil) }
            return .deferred
        } catch StoreError.preconditionFailed(_, let current) {
            switch try overTaken(entry, at: key, condition: .ifAbsent, current: current, pass, again: copy,
                                 startOver: { ($0 as? StoreError).map { $0.isPreconditionFailed || $0.isNotFound } == true }) {
            case .wrote(let written): info = written
            case .done(let outcome): return outcome
            }
        }
        try removeOld(entry, newKey: key, tombstone: try recordAt(entry, key: key, info), copied: true)
        return nil
    }

    private enum AfterTaken { case wrote(ObjectInfo), done(Outcome?) }

    /// A put or copy to `key` found it taken (`current`): the store's version adopted, the
    /// write waiting (a rename cycle broken), a conflict, or the write again over theirs
    /// (`again`), theirs set aside first where it must be kept; a write again that fails as
    /// `startOver` says starts the upload over.
    private func overTaken(_ entry: EntryRecord, at key: String, condition: WriteCondition, current: String?, _ pass: Pass,
                           again: (WriteCondition) throws -> ObjectInfo, startOver: (Error) -> Bool) throws -> AfterTaken {
        switch try resolveTaken(key: key, entryID: entry.id, ino: pass.ino, generation: pass.s.rec.contentGen, isDir: pass.isDir,
                                condition: condition, current: current) {
        case .adopt(let found):
            try removeOld(entry, newKey: key, tombstone: try recordAt(entry, key: key, found))
            return .done(nil)
        case .wait:
            try breakRenameCycle(entry, to: key, pass.s)
            return .done(.deferred)
        case .conflict(let why): return .done(.conflict(why))
        case .over(let theirs, let copy):
            let info: ObjectInfo
            do { info = try again(theirs.map { .ifMatch($0) } ?? .ifAbsent) } catch where startOver(error) {
                undoSetAside(copy)
                return .done(.deferred)  // changed again meanwhile: start over
            }
            if let copy { pass.setAside.append(copy.key) }
            return .wrote(info)
        }
    }

    /// `entry`'s metadata (chmod, chown, xattrs, times) onto the version the store holds, by a
    /// copy onto itself; merged where the store's is newer. Nil, or what the upload comes to.
    private func updateMetadata(_ entry: EntryRecord, at key: String, version oldVersion: String, _ pass: Pass) throws -> Outcome? {
        let (ino, s, store, writes) = (pass.ino, pass.s, self.store, self.writes)
        let meta = metadata(s, entry: entry, generation: s.rec.contentGen)
        do {
            trace("copy \(key)@\(oldVersion) onto itself (metadata) ino \(ino)")
            let info = try runBlocking {
                try await writes.writing(key) { try await store.copy(from: key, version: oldVersion, to: key, metadata: meta, condition: .ifMatch(oldVersion)) }
            }
            try state.write { try $0.recordRemote(entryID: entry.id, key: key, info) }
        } catch let e as StoreError where e.isPreconditionFailed || e.isNotFound {
            trace("\(key): \(e)")
            // Changed in the store, or gone (a store without old versions cannot copy
            // the version this device knows): merged, or written again.
            switch try mergeMetadata(key: key, entry: entry, meta: meta, isPlaceholder: pass.isRegular && !s.rec.present) {
            case .merged: break
            case .again: return .deferred
            case .dropped: return .done
            }
        }
        return nil
    }

    enum Merge { case merged, again, dropped }

    /// A metadata change (chmod, chown, xattrs, times) met a newer version in the store.
    /// Metadata merges: this device's goes on top of the store's version, whatever its bytes.
    /// When those bytes are new to this device, the entry is left at its old version, and the
    /// merged version is not marked as this device's own, so the ChangeFeed brings the bytes.
    func mergeMetadata(key: String, entry: EntryRecord, meta: ObjectMetadata, isPlaceholder: Bool) throws -> Merge {
        let store = self.store, writes = self.writes
        let current: ObjectInfo
        do { current = try runBlocking { try await store.head(key) } } catch StoreError.notFound {
            // Deleted in the store. What is here in full is written again (an edit beats a
            // delete); a placeholder goes with the delete (the ChangeFeed removes it).
            if isPlaceholder { return .dropped }
            try state.write { try $0.setRemote(entryID: entry.id, key: nil, version: nil) }
            return .again
        }
        let sameBytes = current.contentTag != nil && current.contentTag == entry.remoteTag
        var merged = meta
        // One item: the id it has in the store stays.
        merged.fileID = current.metadata.fileID ?? meta.fileID
        if !sameBytes {
            merged.origin = "merge:\(deviceID)"
            merged.mtimeNs = current.metadata.mtimeNs
        }
        let final = merged
        let info: ObjectInfo
        do {
            info = try runBlocking {
                try await writes.writing(key) { try await store.copy(from: key, version: current.version, to: key, metadata: final, condition: .ifMatch(current.version)) }
            }
        } catch StoreError.preconditionFailed { return .again } catch StoreError.notFound { return .again }
        if sameBytes { try state.write { try $0.recordRemote(entryID: entry.id, key: key, info) } }
        return .merged
    }


    /// Names swapped (`mv a t; mv b a; mv t b`), or rotated: each item's new key is held by
    /// another of ours that is itself waiting to move, so none can go first. The one whose
    /// bytes are here (or that has none: a folder, a link) breaks the cycle: its old key is
    /// deleted (left alone if another device wrote there since) and it goes up again as a new
    /// item once its new key is free.
    func breakRenameCycle(_ entry: EntryRecord, to key: String, _ s: Snapshot) throws {
        guard let oldKey = entry.remoteKey, !oldKey.sameBytes(key), s.rec.type != UInt32(S_IFREG) || s.rec.present else { return }
        let cycle = try state.read { tx -> Bool in
            var target = key
            var seen: Set<KeyBytes> = []
            for _ in 0 ..< 64 {
                guard let holder = try tx.entries(remoteKey: target).first(where: { $0.id != entry.id }),
                      let path = try Self.path(of: holder, tx), let rec = try tx.inode(holder.ino) else { return false }
                let wanted = rec.type == UInt32(S_IFDIR) ? path + "/" : path
                if wanted.sameBytes(oldKey) { return true }
                if wanted.sameBytes(target) || !seen.insert(KeyBytes(wanted)).inserted { return false }
                target = wanted
            }
            return false
        }
        guard cycle else { return }
        // Another device's version written there since stays; this item still goes up anew
        // under its new name.
        try deleteNoLongerNamed(oldKey, version: entry.remoteVersion, why: "rename cycle")
        try state.write { try $0.setRemote(entryID: entry.id, key: nil, version: nil) }
        logger.info("names swapped: \(oldKey) is sent again as \(key) once that name is free")
    }

    /// Records that `entry` now stands for `key` at `version`. Where it stood before (another
    /// key) gets a tombstone in the same transaction: the old object is deleted even when the
    /// delete fails now or this device stops before it (else it would come back as a file).
    /// Returns the tombstone's id.
    func recordAt(_ entry: EntryRecord, key: String, _ info: ObjectInfo) throws -> Int64? {
        try state.write { tx -> Int64? in
            try tx.recordRemote(entryID: entry.id, key: key, info)
            guard let old = entry.remoteKey, !old.sameBytes(key) else { return nil }
            return try tx.addTombstone(key: old, version: entry.remoteVersion)
        }
    }

    /// After an entry's object was written at `newKey`, delete where it was before, and drop
    /// the tombstone `recordAt` left for it (which, should this fail, deletes it later).
    /// `copied`: the store copied the old version there (a move, which the store may log as one).
    func removeOld(_ entry: EntryRecord, newKey: String, tombstone: Int64?, copied: Bool = false) throws {
        guard let old = entry.remoteKey, old != newKey else { return }
        try deleteNoLongerNamed(old, version: entry.remoteVersion, why: "moved to \(newKey)", movedTo: copied ? newKey : nil)
        if let tombstone { try state.write { try $0.removeTombstone(tombstone) } }
        keepFolderEmptied(by: old)
    }

    /// A folder another tool made has no marker in the store (it is there only as the prefix of
    /// its files' keys). When `key`, just deleted from the store, was the last thing in one that
    /// this device keeps (an `rm` or `mv` of its files here), the folder is gone from the store
    /// though it is still here: its marker goes up, so that it stays on every device, as it
    /// does here, rather than vanish from the others (`RemoteApplier.removeFoldersGoneWithTheirFiles`).
    func keepFolderEmptied(by key: String) {
        let parts = StoreKey.segments(key).parts.dropLast()
        guard !parts.isEmpty else { return }
        func emptiedFolder(_ tx: StateTransaction) throws -> UInt64? {
            guard let folder = try tx.entry(atPath: parts), folder.remoteKey == nil, try tx.inode(folder.ino)?.type == UInt32(S_IFDIR),
                  try tx.children(of: folder.ino).isEmpty, !(try tx.localChanges(folder.ino).queued) else { return nil }
            return folder.ino
        }
        // Looked at first, written only when it is so (an rm -rf deletes many keys).
        guard (try? state.read(emptiedFolder)) ?? nil != nil else { return }
        let queued = (try? state.write { tx -> Bool in
            guard let ino = try emptiedFolder(tx) else { return false }
            try tx.enqueue(ino)
            return true
        }) ?? false
        if queued { trace("\(parts.joined(separator: "/"))/ had no marker and is empty now: its marker goes up") }
    }
}
