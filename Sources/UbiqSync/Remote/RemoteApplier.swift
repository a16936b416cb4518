import Foundation
import Logging
import Synchronization
import UbiqState
import UbiqStore

/// Changes made in the store by other devices, weighed against this device's and applied here
/// (the change feed's sink). What wins is decided here; the file system makes, moves, updates
/// and removes its items as told (`StoreItemHost`), each under its claims.
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
/// - A move made elsewhere (paired once: `RemoteMoves`) moves the item here, keeping what it
///   holds (downloaded bytes, pins, open files, the inode).
public final class RemoteApplier: RemoteChangeSink, @unchecked Sendable {
    let state: LocalState
    let materializer: Materializer
    /// What this device wrote in the store and when (`writtenHere`); nil without an uploader.
    let writes: StoreWrites?
    let logger: Logger
    /// The file system whose items these are (it outlives the feed that holds this).
    let items: any StoreItemHost
    /// Folders deleted in the store that wait for what they hold to go: how many items each
    /// held at the last try, and the tries since that went down (see `applyRemoteDelete`).
    private let foldersEmptying = Mutex<[UInt64: (held: Int, idle: Int)]>([:])
    /// What was said of the store's keys that wait at every poll (each said once: `sayOnce`).
    private let saidOfKeys = Mutex(Set<String>())

    /// New items in one run of `addFromRemote(run:)` at most.
    public static let runSize = 500
    /// Tries in a row, a poll apart, in which a folder deleted in the store did not empty before
    /// it stays (and goes up again).
    public static let emptyingTries = 3

    public init(items: any StoreItemHost, state: LocalState, materializer: Materializer, writes: StoreWrites?, logger: Logger) {
        self.items = items
        self.state = state
        self.materializer = materializer
        self.writes = writes
        self.logger = logger
    }

    public func commitPendingCreates() throws { try items.commitPendingCreates() }
    public func storeAnswered() { items.storeAnswered() }

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
        var run: [ObjectInfo] = []
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
                run.append(info)
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
                    if done, let old = moves.pinsFrom[KeyBytes(c.key)], items.facts(old)?.pinned == true,
                       let new = try state.read({ try $0.entries(remoteKey: c.key).first?.ino }) {
                        try items.setPinned(new, true)
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

    /// The folder `key` is in, as a prefix: a folder's key ("a/b/") is in "a/", as a file's is.
    static func parentFolder(_ key: String) -> String {
        StoreKey.folder(of: key.hasSuffix("/") ? String(key.dropLast()) : key)
    }

    /// Logs `message` of `key` the first time it is said.
    func sayOnce(_ key: String, _ message: String) {
        let first = saidOfKeys.withLock { said in
            if said.count > 10_000 { said.removeAll() }
            return said.insert(key + "\u{0}" + message).inserted
        }
        if first { logger.info("\(message)") }
    }

    /// Whether this device wrote `key` in the store after a question asked at `askedAt`
    /// (`StoreWrites`); call after reading what it records of the key.
    func writtenHere(since askedAt: UInt64?, _ key: String) -> Bool {
        guard let askedAt, let writes else { return false }
        return writes.writtenSince(askedAt, key)
    }

    /// Starts the download of `ino` when it is a file with bytes under a pin (or pinned itself).
    private func downloadIfPinned(_ ino: UInt64, size: Int64) {
        if size > 0, (try? items.isPinned(ino)) == true { try? materializer.start(ino) }
    }

    // MARK: - Additions

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
    private func addFromRemote(run: [ObjectInfo], askedAt: UInt64?) -> [String] {
        let made: StoreItemRun
        do {
            guard let dir = try remoteParent(of: run[0].key, StoreKey.segments(run[0].key).parts) else { return run.map(\.key) }
            made = try items.makeItems(in: dir, run) { infos in
                // Asked again under the folder's claim, as `applyRemotePut` asks each just before
                // it makes it: a key this device recorded since the first read waits, and so does
                // one it wrote since the store was asked (a tombstone made and gone).
                var since = try state.read { tx in Set(try tx.recordedKeys(among: infos.map(\.key)).map(KeyBytes.init)) }
                for info in infos where writtenHere(since: askedAt, info.key) { since.insert(KeyBytes(info.key)) }
                return since
            }
            if !made.made.isEmpty, (try? items.isPinned(dir)) == true {
                for m in made.made where m.size > 0 { try? materializer.start(m.ino) }
            }
        } catch {
            logger.warning("could not apply the store's changes in the folder of \(run[0].key): \(error)")
            return run.map(\.key)
        }
        var retry = made.retry
        for info in made.oneByOne {
            do { if !(try applyRemotePut(info.key, info, before: nil, askedAt: askedAt)) { retry.append(info.key) } } catch {
                logger.warning("could not apply the store's change of \(info.key): \(error)")
                retry.append(info.key)
            }
        }
        return retry
    }

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
        if let existing = try items.child(of: parent, named: name) {
            // The same folder made on both sides is one folder.
            let adopt: EntryRecord? = try state.read { tx in
                guard let e = try tx.entry(parent: parent, name: name), e.remoteKey == nil,
                      existing.isDirectory, type == UInt32(S_IFDIR) else { return nil }
                return e
            }
            if let adopt {
                try items.record(adopt, as: info)
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
        guard let ino = try items.makeItem(in: parent, name: name, type: type, meta: info.metadata, size: info.size,
                                           remote: info) else { return false }
        if type == UInt32(S_IFREG) { downloadIfPinned(ino, size: info.size) }
        return true
    }

    /// The folder that holds `key`'s item, with the folders on the way made as needed; nil
    /// when a file stands where a folder would be, or a folder changed meanwhile (tried again
    /// at the next poll).
    private func remoteParent(of key: String, _ parts: [String]) throws -> UInt64? {
        var parent = StoreItemFacts.rootIno
        for seg in parts.dropLast() {
            let name = Array(seg.utf8)
            if let existing = try items.child(of: parent, named: name) {
                guard existing.isDirectory else {
                    // Said once: the key waits at every poll (objects `a` and `a/b` in the store
                    // said it 3,200 times in 33 minutes).
                    sayOnce(key, "not adding \(key) yet: a file here stands where its folder would be")
                    return nil
                }
                parent = existing.ino
            } else {
                guard let made = try items.makeItem(in: parent, name: name, type: UInt32(S_IFDIR),
                                                    meta: ObjectMetadata(kind: .directory, mode: 0o755, uid: getuid(),
                                                                         gid: getgid(), mtimeNs: nowNanos()),
                                                    size: 0, remote: nil) else { return nil }
                parent = made
            }
        }
        return parent
    }

    // MARK: - Moves and updates

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
        guard try items.moveItem(e, to: parent, name: name, key: key, tag: tag, digest: digest) else { return false }
        if e.parent != parent || e.name != name { logger.info("\(e.remoteKey ?? "?") moved to \(key) in the store: moved here") }
        var now = e
        now.parent = parent; now.name = name; now.remoteKey = key
        now.remoteTag = tag; now.remoteDigest = digest
        return try updateFromRemote(now, info)
    }

    private func updateFromRemote(_ e: EntryRecord, _ info: ObjectInfo) throws -> Bool {
        let ino = e.ino
        let local = try state.read { try $0.localChanges(ino) }
        if local.content || items.isOpenForWriting(ino) {
            // Changed on both sides: this device's upload meets the store's version and keeps
            // both (a conflict copy). Tried again at each poll until that has happened.
            logger.info("\(e.remoteKey ?? "?") changed in the store and here: the local edit is kept for its upload to settle")
            return false
        }
        guard let item = items.facts(ino) else { return true }
        let newType = (info.key.hasSuffix("/") ? ObjectKind.directory : info.metadata.kind).fileType
        if item.type != newType {
            // A different kind of item under the same name: the old one goes, the new one comes.
            guard try applyRemoteDelete(e.remoteKey!, before: e.remoteVersion) else { return false }
            return try addFromRemote(info.key, info)
        }
        let isFile = item.type == UInt32(S_IFREG)
        let contentChanged = isFile && (e.remoteTag == nil || info.contentTag == nil || e.remoteTag != info.contentTag)
        if contentChanged {
            // One name of a hard link: it leaves the link (`StoreItemHost.splitLink`).
            if item.linked {
                guard let made = try items.splitLink(e, to: info) else { return false }
                logger.info("\(info.key) changed in the store: it is a file of its own here now, no longer a hard link of inode \(ino)")
                downloadIfPinned(made, size: info.size)
                return true
            }
            // A reader keeps the version it opened until it closes.
            if item.isOpen {
                items.updateAtLastClose(ino)
                return false
            }
        }
        // Metadata changed here only (a chmod, an xattr, a rename waiting to be uploaded): the
        // store's content comes, and this device's metadata stays on it, to be uploaded on top.
        guard let wasLocal = try items.updateItem(e, to: info, contentChanged: contentChanged, keepLocalMeta: local.metadata)
        else { return false }
        // New bytes of a file that was here, or under a pin, come at once.
        if wasLocal { try? materializer.start(ino) } else if contentChanged { downloadIfPinned(ino, size: info.size) }
        return true
    }

    // MARK: - Removals

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
        let item = items.facts(ino)
        let (isDir, hasChildren) = (item?.isDirectory ?? false, item?.hasChildren ?? false)
        // An edit beats a delete; so does a rename or a metadata change of what is here in
        // full. A placeholder renamed or chmod-ed here goes: its bytes went with the delete.
        let changedHere = local.content || (local.queued && !(item?.isPlaceholder ?? false))
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
        if changedHere || items.isOpenForWriting(ino) || (isDir && hasChildren) {
            // Changed here, or a folder with something the store never had in it: kept,
            // and uploaded again.
            logger.info("\(key) was deleted in the store but changed here: kept, and uploaded again")
            try items.sendAgain(e)
            return true
        }
        let removed = try items.removeItem(e, unlessRecordedSince: before)
        if removed { logger.info("\(key) was deleted in the store: removed here") }
        return removed
    }

    /// A folder another tool made has no marker in the store: it is there only as the prefix of
    /// its files' keys, and here it is a folder with no key. When the store's changes leave one
    /// empty here (its files deleted or moved elsewhere, a folder renamed there), it is gone from
    /// the store too, and goes here; so do its parents that it leaves empty the same way. One
    /// changed here (a new name, mode or xattr: it is on its way up as a folder) stays.
    private func removeFoldersGoneWithTheirFiles(_ candidates: Set<UInt64>) {
        func unmarkedAndUnchanged(_ tx: StateTransaction, _ dir: UInt64) throws -> Bool {
            try tx.entries(of: dir).first?.remoteKey == nil && !(try tx.isChangedHere(dir))
        }
        var queue = Array(candidates)
        while let dir = queue.popLast() {
            guard dir != StoreItemFacts.rootIno, let item = items.facts(dir), item.isDirectory, !item.hasChildren,
                  (try? state.read({ try unmarkedAndUnchanged($0, dir) })) == true,
                  // Asked again where a change recorded meanwhile would be seen.
                  let parent = items.removeEmptyFolder(dir, if: unmarkedAndUnchanged) else { continue }
            queue.append(parent)
        }
    }
}
