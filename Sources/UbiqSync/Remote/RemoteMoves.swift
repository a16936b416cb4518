import Foundation
import UbiqState
import UbiqStore

/// One batch of the store's changes, in the order the file system applies them, with the
/// moves made on another device that are among them.
public struct RemoteBatch: Sendable {
    /// Additions and updates: parents before children.
    public let puts: [RemoteChange]
    /// Removals: children before parents.
    public let deletes: [RemoteChange]
    /// New keys that are items here moved on another device (`RemoteMoves.pair`).
    public var moves = RemoteMoves()

    public init(_ changes: [RemoteChange], moves: RemoteMoves = RemoteMoves()) {
        func depth(_ k: String) -> Int { k.utf8.reduce(0) { $0 + ($1 == UInt8(ascii: "/") ? 1 : 0) } - (k.hasSuffix("/") ? 1 : 0) }
        puts = changes.filter { $0.info != nil }.sorted { (depth($0.key), $0.key) < (depth($1.key), $1.key) }
        deletes = changes.filter { $0.info == nil }.sorted { (depth($0.key), $0.key) > (depth($1.key), $1.key) }
        self.moves = moves
    }

    public var changes: [RemoteChange] { puts + deletes }
}

/// Moves made on another device, inferred once, here, whatever the backend: a store has
/// only copies and deletes (a log's `move` entry is read back as the put and the delete it
/// stands for). The change feed asks two things of each batch before the file system
/// applies it:
/// - `deletesImplied`: a new item that this device has under another key may be a move whose
///   delete has not reached this device yet; the old key is asked for, and when it is gone,
///   its delete joins the batch.
/// - `pair`: which new keys of the batch are items here under a deleted key of it, unchanged
///   here since. The file system applies those as moves, keeping what is here (downloaded
///   bytes, pins, open files, the inode); the rest as additions and removals.
public struct RemoteMoves: Sendable {
    /// New keys, and the entry of the item here that moved there.
    public var items: [KeyBytes: EntryRecord] = [:]
    /// New folder keys that come as new folders, and the folder here they moved from
    /// (not whole: `pair`): a pin of it goes to the new folder.
    public var pinsFrom: [KeyBytes: UInt64] = [:]

    public init() {}

    /// A new item in the store that this device has under another key (the same id in the
    /// store, or for a file without one the same bytes) is a copy, or a move made on another
    /// device: the store copies, then deletes the old key, and the delete may reach this
    /// device a poll later (a log object written between the two). The old key is asked for
    /// here (one HEAD per such item), and when it is gone its delete goes with this batch, so
    /// the file system applies a move: nothing is downloaded again.
    static func deletesImplied(by changes: [RemoteChange], state: LocalState, store: any CloudStore,
                               asked: inout Set<KeyBytes>) throws -> [RemoteChange] {
        var out: [RemoteChange] = []
        let files = changes.filter { c in
            guard let info = c.info, c.recordedBefore == nil, !c.key.hasSuffix("/"), info.metadata.kind != .directory else { return false }
            return info.metadata.fileID != nil || info.isFileWithBytes
        }
        // One read for all of them (a listing's page is 10,000 objects: a read each was a tenth
        // of a large import).
        let holding = try state.read { tx in
            let recorded = Set(try tx.recordedKeys(among: files.map(\.key)).map(KeyBytes.init))
            // The ids and bytes any item here records, asked for all of them at once: an item
            // none of whose is recorded is held by nothing here (most of a listing's).
            let infos = files.lazy.filter { !recorded.contains(KeyBytes($0.key)) }.map { $0.info! }
            let ids = try tx.recorded(.fileID, among: infos.compactMap(\.metadata.fileID))
            let tags = try tx.recorded(.tag, among: infos.compactMap(\.contentTag))
            let digests = try tx.recorded(.digest, among: infos.compactMap(\.metadata.sha256))
            // Bytes that many items here hold (copies of one file, another tool's files of the
            // same content) do not say which of them moved: a new item is not paired by such
            // bytes. (Each was a lookup among all their holders and up to eight HEADs: a fresh
            // device's rest of a bucket of a million alike files took over twenty minutes.)
            var common: [String: Bool] = [:]
            func manyHold(_ what: StateTransaction.RecordedValue, _ value: String?) throws -> Bool {
                guard let value else { return false }
                let key = what.rawValue + ":" + value
                if let known = common[key] { return known }
                let many = try tx.recorded(what, value, byMoreThan: Self.holdersOfAMove)
                common[key] = many
                return many
            }
            return try files.map { c -> [EntryRecord] in
                let info = c.info!
                guard !recorded.contains(KeyBytes(c.key)) else { return [] }
                // By bytes too when no item here records the id (uploaded before items had one).
                if let id = info.metadata.fileID, ids.contains(id), case let found = try tx.entries(fileID: id, limit: 8), !found.isEmpty {
                    return found
                }
                guard info.isFileWithBytes, info.contentTag.map(tags.contains) == true || info.metadata.sha256.map(digests.contains) == true,
                      try !manyHold(.tag, info.contentTag), try !manyHold(.digest, info.metadata.sha256)
                else { return [] }
                let name = Array(StoreKey.segments(c.key).parts.last!.utf8)
                return try tx.entries(tag: info.contentTag, digest: info.metadata.sha256, name: name, limit: Self.holdersOfAMove)
                    .filter { $0.holdsTheBytes(of: info) }
            }
        }
        for holders in holding {
            for e in holders {
                // A key of this batch already: its own change says whether it went.
                guard let old = e.remoteKey, let version = e.remoteVersion, asked.insert(KeyBytes(old)).inserted else { continue }
                do {
                    _ = try runBlocking { try await store.head(old) }
                } catch StoreError.notFound {
                    out.append(RemoteChange(key: old, info: nil, recordedBefore: version))
                    break
                } catch {
                    continue  // a copy, as far as this poll can tell
                }
            }
        }
        return out
    }

    /// Items holding one file's bytes past which a new item is not paired by them (`deletesImplied`).
    static let holdersOfAMove = 8

    /// The new keys of `puts` that are items here under a key of `deletes`, unchanged here
    /// since: a move made on another device (the store copies, then deletes). An item is paired
    /// with a deleted item of the same id in the store (`ObjectMetadata.fileID`), else a file
    /// with a deleted file that holds its bytes (`holdsTheBytes`); a folder with a deleted
    /// folder whose files moved into it under the same names. Applied as moves, they keep
    /// what is here: downloaded bytes, pins, open files, the inode.
    static func pair(_ batch: RemoteBatch, in state: LocalState) throws -> RemoteMoves {
        let (puts, deletes) = (batch.puts, batch.deletes)
        guard !puts.isEmpty, !deletes.isEmpty else { return RemoteMoves() }
        return try state.read { tx in
            // What went from the store, as this device recorded it, unchanged here since: files by
            // digest and by tag, and by those with the name (a folder's move keeps its files' names;
            // files with the same bytes are many, as often as not).
            var goneFiles = GoneFiles()
            var goneFolders: [KeyBytes: EntryRecord] = [:]
            // Items other than folders by their id in the store (`ObjectMetadata.fileID`).
            var goneItems: [String: EntryRecord] = [:]
            for d in deletes {
                guard let e = try tx.entries(remoteKey: d.key).first, e.remoteVersion == d.recordedBefore,
                      let r = try tx.inode(e.ino) else { continue }
                if try tx.isChangedHere(e.ino) { continue }
                if r.type == UInt32(S_IFDIR) {
                    if d.key.hasSuffix("/") { goneFolders[KeyBytes(d.key)] = e }
                    continue
                }
                if let id = e.remoteFileID, !d.key.hasSuffix("/") { goneItems[id] = e }
                if r.type == UInt32(S_IFREG) { goneFiles.add(e) }
            }
            var moves = RemoteMoves()
            func isNew(_ key: String) throws -> Bool { try tx.entries(remoteKey: key).isEmpty && !(try tx.hasTombstone(key: key)) }
            // Files first: they are what shows which folder went where. An item the store names
            // by its id is that item, whatever its bytes (an empty file or a link has none to
            // go by, and a file may be moved and edited at once); one without, by its bytes.
            var folderMoves: [KeyBytes: KeyBytes] = [:]  // new folder key -> old
            var paired: [(RemoteChange, EntryRecord)] = []
            for p in puts {
                guard let info = p.info, info.metadata.kind != .directory, !p.key.hasSuffix("/"), p.recordedBefore == nil,
                      let id = info.metadata.fileID, let e = goneItems[id], try isNew(p.key) else { continue }
                goneItems[id] = nil
                goneFiles.exclude(e.id)
                paired.append((p, e))
            }
            let byID = Set(paired.map { KeyBytes($0.0.key) })
            for p in puts where !byID.contains(KeyBytes(p.key)) {
                guard let info = p.info, info.isFileWithBytes, p.recordedBefore == nil, try isNew(p.key) else { continue }
                guard let e = goneFiles.take(holding: info, name: Array(StoreKey.segments(p.key).parts.last!.utf8)) else { continue }
                paired.append((p, e))
            }
            for (p, e) in paired {
                guard let old = e.remoteKey else { continue }
                moves.items[KeyBytes(p.key)] = e
                for (new, was) in Self.foldersMoved(from: old, to: p.key) where folderMoves[new] == nil { folderMoves[new] = was }
            }
            var folders: [KeyBytes: EntryRecord] = [:]
            for p in puts where p.key.hasSuffix("/") && p.recordedBefore == nil {
                guard let old = folderMoves[KeyBytes(p.key)], let e = goneFolders[old], try isNew(p.key) else { continue }
                folders[KeyBytes(p.key)] = e
            }
            // A folder moves here whole only when all it holds moves with it in this batch: else
            // what it holds that the other device did not move (a file this device added since,
            // what the next poll brings) would sit here under the new name and there under the
            // old. Then each file moves on its own, into a new folder that takes the old one's pin.
            for (new, e) in folders {
                guard let old = e.remoteKey else { continue }
                var whole = true
                var stack = [e.ino]
                walk: while let dir = stack.popLast() {
                    for child in try tx.children(of: dir) {
                        guard let key = child.remoteKey, key.utf8.starts(with: old.utf8) else { whole = false; break walk }
                        let there = KeyBytes(new.key + String(decoding: key.utf8.dropFirst(old.utf8.count), as: UTF8.self))
                        if key.hasSuffix("/") {
                            guard folders[there]?.id == child.id else { whole = false; break walk }
                            stack.append(child.ino)
                        } else if moves.items[there]?.id != child.id {
                            whole = false; break walk
                        }
                    }
                }
                if whole { moves.items[new] = e } else { moves.pinsFrom[new] = e.ino }
            }
            return moves
        }
    }

    /// Files whose keys went from the store, to be paired with new keys holding their bytes.
    struct GoneFiles {
        private var lists: [String: [EntryRecord]] = [:]
        /// How far each list has been taken from.
        private var next: [String: Int] = [:]
        private var taken = Set<Int64>()

        private static func keys(digest: String?, tag: String?, name: [UInt8]?) -> [String] {
            let n = name.map { "\u{0}" + String(decoding: $0, as: UTF8.self) } ?? ""
            return (digest.map { ["d" + $0 + n] } ?? []) + (tag.map { ["t" + $0 + n] } ?? [])
        }

        /// `id`'s entry is taken already (paired by the item's id).
        mutating func exclude(_ id: Int64) { taken.insert(id) }

        mutating func add(_ e: EntryRecord) {
            for k in Self.keys(digest: e.remoteDigest, tag: e.remoteTag, name: e.name) + Self.keys(digest: e.remoteDigest, tag: e.remoteTag, name: nil) {
                lists[k, default: []].append(e)
            }
        }

        /// A file not taken yet that holds `info`'s bytes, one named `name` first.
        mutating func take(holding info: ObjectInfo, name: [UInt8]) -> EntryRecord? {
            for k in Self.keys(digest: info.metadata.sha256, tag: info.contentTag, name: name)
                + Self.keys(digest: info.metadata.sha256, tag: info.contentTag, name: nil) {
                guard let list = lists[k] else { continue }
                var i = next[k, default: 0]
                while i < list.count, taken.contains(list[i].id) || !list[i].holdsTheBytes(of: info) { i += 1 }
                next[k] = i
                if i < list.count {
                    taken.insert(list[i].id)
                    return list[i]
                }
            }
            return nil
        }
    }

    /// The folders that moved with a file moved from `old` to `new`: each pair of folder keys
    /// below which the rest of the path is the same ("B/sub/f" from "A/sub/f": `B/sub/` from
    /// `A/sub/`, `B/` from `A/`).
    public static func foldersMoved(from old: String, to new: String) -> [(new: KeyBytes, old: KeyBytes)] {
        let slash = UInt8(ascii: "/")
        var n = Array(new.utf8).split(separator: slash, omittingEmptySubsequences: false).map(Array.init)
        var o = Array(old.utf8).split(separator: slash, omittingEmptySubsequences: false).map(Array.init)
        var out: [(KeyBytes, KeyBytes)] = []
        while n.count > 1, o.count > 1, n.last == o.last {
            n.removeLast(); o.removeLast()
            if n == o { break }
            func key(_ segs: [[UInt8]]) -> KeyBytes { KeyBytes(String(decoding: Array(segs.joined(separator: [slash])) + [slash], as: UTF8.self)) }
            out.append((key(n), key(o)))
        }
        return out
    }
}
