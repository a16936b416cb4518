import Foundation
import Synchronization
import Logging
import UbiqCoordinator
import UbiqState
import UbiqStore

// A key already taken in the store: an upload of ours whose answer was lost, another device's
// version kept as a conflict copy; and the versions the store keeps (`ubiq versions`, `ubiq restore`).
extension Uploader {
    /// The versions the store keeps of `key`, newest first (`ubiq versions --all`).
    public func history(of key: String) throws -> [ObjectInfo] {
        let store = self.store
        return try runBlocking { try await store.versions(of: key) }
    }

    /// Copies `version` of `key`, in the store, as its newest version, provided the current
    /// version is still `current` (`ubiq restore`). Nothing is downloaded; every device's
    /// ChangeFeed brings it in, this one's too. Returns the new version, or nil when the store
    /// does not keep `version`. Throws `preconditionFailed` when the key changed meanwhile.
    public func restore(key: String, version: String, over current: String) throws -> String? {
        guard let old = try history(of: key).first(where: { $0.version == version }) else { return nil }
        if old.version == current { return current }
        var meta = old.metadata
        meta.origin = "restore:\(deviceID)"
        meta.device = deviceName
        let restored = meta
        let store = self.store, writes = self.writes
        return try runBlocking {
            try await writes.writing(key) { try await store.copy(from: key, version: old.version, to: key, metadata: restored, condition: .ifMatch(current)) }
        }.version
    }

    /// Deletes `key`, which this device no longer names (an item moved or removed), if the
    /// store still holds `version` there (nil: whatever it holds). Another version there is
    /// left alone (an edit elsewhere beats the delete a move or removal implies) unless this
    /// device wrote it and no item here records it (an upload whose answer was lost, or made
    /// just before a crash): nothing of another device's is there to keep, and it goes too;
    /// left, it would come back as a file on every device. Other failures are thrown (the
    /// caller's tombstone or upload tries again). `movedTo`: where the store copied `version`
    /// (a move's second half, `CloudStore.deleteMoved`).
    func deleteNoLongerNamed(_ key: String, version: String?, why: String, movedTo: String? = nil) throws {
        let store = self.store, writes = self.writes
        do {
            trace("delete \(key) \(version ?? "always") (\(why))")
            if let version, let movedTo {
                try runBlocking { try await writes.writing(key) { try await store.deleteMoved(key, version: version, to: movedTo) } }
            } else {
                try runBlocking { try await writes.writing(key) { try await store.delete(key, condition: version.map { .ifMatch($0) } ?? .always) } }
            }
        } catch StoreError.notFound {
        } catch StoreError.preconditionFailed {
            do {
                if try deleteUnrecordedOfOurs(key, why: why) { return }
            } catch StoreError.notFound {
                return
            } catch StoreError.preconditionFailed {}
            logger.info("left \(key) in the store: it changed there since")
        }
    }

    /// Deletes the version at `key` when this device wrote it and no item here records it
    /// (`leftoverOfOurs`); whether it was such a version. Throws `notFound` when nothing is
    /// there, `preconditionFailed` when it changed meanwhile.
    func deleteUnrecordedOfOurs(_ key: String, why: String) throws -> Bool {
        guard let leftover = try leftoverOfOurs(key) else { return false }
        let store = self.store, writes = self.writes
        trace("delete \(key) ifMatch(\(leftover)) (\(why): our own unrecorded upload)")
        try runBlocking { try await writes.writing(key) { try await store.delete(key, condition: .ifMatch(leftover)) } }
        return true
    }

    /// The store's current version of `key` when this device wrote it and no item here records
    /// it: an upload whose answer never came (a lost reply, a crash), from an item since deleted,
    /// renamed or written again here. Nil otherwise (another device's version, or one recorded).
    func leftoverOfOurs(_ key: String) throws -> String? {
        let store = self.store
        let info = try runBlocking { try await store.head(key) }
        return try isUnrecordedOfOurs(info, at: key) ? info.version : nil
    }

    /// Whether `info`, the store's version at `key`, is one this device wrote that no item here records.
    func isUnrecordedOfOurs(_ info: ObjectInfo, at key: String) throws -> Bool {
        guard let origin = info.metadata.origin, origin.hasPrefix(deviceID + ":") else { return false }
        return try !state.read { try $0.entries(remoteKey: key).contains { $0.remoteVersion == info.version } }
    }

    /// `over(version, copy)`: write again over the store's `version` (nil: the key is free
    /// now), its content kept at `copy` first.
    enum Taken { case adopt(ObjectInfo), wait, conflict(String), over(String?, copy: (key: String, version: String)?) }

    /// A conditional write found the key taken. Decide whose it is.
    func resolveTaken(key: String, entryID: Int64, ino: UInt64, generation: Int64, isDir: Bool,
                              condition: WriteCondition, current: String?) throws -> Taken {
        let store = self.store
        let info: ObjectInfo
        do { info = try runBlocking { try await store.head(key) } } catch StoreError.notFound {
            // Deleted in the store meanwhile: an edit beats a delete.
            return isDir ? .wait : .over(nil, copy: nil)
        } catch { return .wait }
        trace("\(key) taken by \(info.version) from \(info.metadata.origin ?? "?") (ino \(ino) gen \(generation))")
        // Our own upload from before a crash, recorded in the store but not here.
        if info.metadata.origin == origin(ino, generation) { return .adopt(info) }
        // Another name of ours still sits there and is about to move away (or be deleted).
        // Asked before folders merge: a folder that adopted the marker of one moved away
        // would be left with none once the move deletes it.
        if condition == .ifAbsent {
            let held = try state.read { tx in
                try tx.entries(remoteKey: key).contains { $0.id != entryID } || tx.hasTombstone(key: key)
            }
            if held { return .wait }
        }
        // Folders merge: the same folder made on two devices is one folder.
        if isDir && info.metadata.kind == .directory && condition == .ifAbsent { return .adopt(info) }
        // This device's own upload whose answer never came, from an item since deleted or
        // renamed here: nothing of another device's to keep, so this write goes over it.
        if !isDir, try isUnrecordedOfOurs(info, at: key) {
            trace("\(key): our own unrecorded upload \(info.version) is written over")
            return .over(info.version, copy: nil)
        }
        let why = "\(key) changed in the store since this device last saw it (now \(current ?? "?"))"
        if isDir { return .conflict(why) }
        // Both sides changed it: this device's version takes the name, the store's is kept
        // beside it as a conflict copy that every device sees.
        let kept: (key: String, version: String)?
        do { kept = try keepAsConflictCopy(key: key, theirs: info) } catch StoreError.notFound {
            return .wait  // their version went away meanwhile: start over
        }
        guard let copy = kept else { return .conflict(why) }
        return .over(info.version, copy: copy)
    }

    /// Copies (in the store) `theirs` to a conflict copy's name beside `key`. Nil when no
    /// name could be had. A copy left by an attempt that crashed is found and used again.
    func keepAsConflictCopy(key: String, theirs: ObjectInfo) throws -> (key: String, version: String)? {
        let store = self.store, writes = self.writes
        let slash = key.lastIndex(of: "/")
        let folder = slash.map { String(key[...$0]) } ?? ""
        let name = slash.map { String(key[key.index(after: $0)...]) } ?? key
        let device = theirs.metadata.device ?? theirs.metadata.origin.map { String($0.prefix(8)) } ?? "unknown"
        let date = Date(timeIntervalSince1970: Double(theirs.metadata.mtimeNs) / 1e9)
        var copyMeta = theirs.metadata
        // Not any device's own write, this one's included: every ChangeFeed brings it in.
        copyMeta.origin = "conflict-copy:\(deviceID)"
        // Another item than the one whose name it keeps: an id of its own at its first upload.
        copyMeta.fileID = nil
        let meta = copyMeta
        for n in 1...50 {
            let copyKey = folder + ConflictName.make(for: name, device: device, date: date, counter: n)
            do {
                let made = try runBlocking {
                    try await writes.writing(copyKey) { try await store.copy(from: key, version: theirs.version, to: copyKey, metadata: meta, condition: .ifAbsent) }
                }
                return (copyKey, made.version)
            } catch StoreError.preconditionFailed {
                let there = try? runBlocking { try await store.head(copyKey) }
                if let there, there.contentTag != nil, there.contentTag == theirs.contentTag { return (copyKey, there.version) }
            }
        }
        logger.error("no free name for a conflict copy of \(key)")
        return nil
    }

    /// Removes a conflict copy made for a write that then lost another race (it starts over).
    func undoSetAside(_ copy: (key: String, version: String)?) {
        guard let copy else { return }
        let store = self.store, writes = self.writes
        try? runBlocking { try await writes.writing(copy.key) { try await store.delete(copy.key, condition: .ifMatch(copy.version)) } }
    }
}
