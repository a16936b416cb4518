import Foundation
import UbiqSync

/// Conflict copies: when two devices changed one file, the version this device did not
/// keep under the name sits beside it as "NAME (conflict DEVICE DATE).EXT" (ConflictName).
/// An item with such a copy beside it shows `conflict`; deleting the copies (or `ubiq
/// resolve`) settles it, on every device.
extension FileSystem {
    /// The conflict copies in folder `dir`, by the name each was made for (under the inode
    /// table's lock, where a `Node` is reached).
    func conflictIndex(of dir: Node) -> [[UInt8]: [[UInt8]]] {
        if let index = dir.conflictIndex { return index }
        var index: [[UInt8]: [[UInt8]]] = [:]
        for name in dir.children.keys where name.count > 28 {
            guard let s = String(validating: name, as: UTF8.self), s.contains(" (conflict "),
                  let target = ConflictName.target(of: s) else { continue }
            index[Array(target.utf8), default: []].append(name)
        }
        dir.conflictIndex = index
        return index
    }

    /// True when a conflict copy sits beside any of `names` ((folder, name) pairs of one item).
    func hasConflictCopies(_ names: [(UInt64, [UInt8])]) -> Bool {
        inodes.locked { t in
            names.contains { folder, name in t[folder].map { conflictIndex(of: $0)[name] != nil } ?? false }
        }
    }

    /// The items among `inos` (folders' contents included) that have conflict copies beside them.
    func itemsWithConflictCopies(_ inos: [UInt64]) -> Set<UInt64> {
        inodes.locked { t in
            var out = Set<UInt64>()
            for i in inos {
                guard let dir = t.resident(i), dir.isDirectory else { continue }  // (folders are in memory)
                for target in conflictIndex(of: dir).keys {
                    if let item = dir.children[target] { out.insert(item) }
                }
            }
            return out
        }
    }
}

extension FileSystem {
    /// The item at `path` (names below the root, "/"-separated; "" is the root).
    public func item(at path: String) throws -> UInt64 {
        try inodes.locked { t in
            var cur = rootIno
            for part in path.split(separator: "/") where part != "." {
                guard let next = try t.directory(cur).children[Array(part.utf8)] else { throw FSError.notFound }
                cur = next
            }
            return cur
        }
    }

    /// Where the item at `path` is in the store (its key and version there), and whether
    /// this device has changes to it that the store lacks. Throws `notUploaded` when the
    /// store has never had it.
    public func storeItem(at path: String) throws -> (key: String, version: String, changedHere: Bool) {
        let ino = try item(at: path)
        return try readState { tx in
            guard let e = try tx.entries(of: ino).first(where: { $0.remoteKey != nil }),
                  let key = e.remoteKey, let version = e.remoteVersion else { throw FSError.notUploaded }
            return (key, version, try tx.isChangedHere(ino))
        }
    }
}
