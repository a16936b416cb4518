import Foundation
import UbiqCoordinator
import UbiqState

/// Names: create, mkdir, mknod, symlink, link, unlink, rmdir, rename, readdir.
extension FileSystem {
    /// Creates a node named `name` in `dir` (the parent claimed).
    /// For a regular file, `openFD` receives its new cache file, open read-write.
    /// `deferRows`: the rows wait for the next transaction (`deferCreate`; a file from `create`).
    private func makeNode(in dir: Node, of t: Inodes, name: [UInt8], type: UInt32, perm: UInt32, caller: Caller,
                          rdev: UInt64 = 0, target: [UInt8]? = nil, openFD: UnsafeMutablePointer<Int32>? = nil,
                          deferRows: Bool = false) throws -> Node {
        try Self.validate(name: name)
        try Self.checkNotReserved(parent: dir.rec.ino, name: name)
        if dir.children[name] != nil { throw FSError.exists }
        if dir.nlink == 0 { throw FSError.notFound }  // directory removed while we waited
        var perm = perm & 0o7777
        var gid = caller.gid
        if dir.rec.perm & UInt32(S_ISGID) != 0 {
            gid = dir.rec.gid
            if type == UInt32(S_IFDIR) { perm |= UInt32(S_ISGID) }
        }
        let now = nowNanos()
        let ino = t.nextIno
        let rec = InodeRecord(ino: ino, type: type, perm: perm, uid: caller.uid, gid: gid, size: 0,
                              atimeNs: now, mtimeNs: now, ctimeNs: now, rdev: rdev, target: target)
        var fd: Int32 = -1
        if type == UInt32(S_IFREG) {
            do { fd = try cache.createAndOpen(ino) } catch { throw FSError.fromErrno(errno) }
        }
        defer { if let openFD { openFD.pointee = fd } else if fd >= 0 { close(fd) } }
        dir.rec.mtimeNs = now
        dir.rec.ctimeNs = now
        let changes = StateChanges(now: state.time.now)
        changes.upsert(rec)
        changes.insertEntry(parent: dir.rec.ino, name: name, ino: ino)
        changes.upsert(dir.rec)
        changes.enqueue(ino, delay: uploadDelay)
        if deferRows { deferCreate(ino, changes.list) } else { try persist { $0.append(changes.list) } }
        let n = t.attach(rec, in: dir, name: name)
        n.lookups = 1
        return n
    }

    public func mkdir(_ parent: UInt64, _ name: [UInt8], mode: UInt32, caller: Caller) throws -> Attributes {
        try checkFolderLevels(parent: parent, name: name)
        let c = try claim([parent], .write)
        defer { coordinator.release(c) }
        let a = try inodes.locked { t in
            attributes(try makeNode(in: try t.directory(parent), of: t, name: name, type: UInt32(S_IFDIR), perm: mode, caller: caller))
        }
        kickUploader()
        emit(.changed, a.ino)
        return a
    }

    /// mknod(2): regular files, FIFOs, sockets and device nodes.
    public func mknod(_ parent: UInt64, _ name: [UInt8], mode: UInt32, rdev: UInt64, caller: Caller) throws -> Attributes {
        let type = mode & UInt32(S_IFMT)
        let allowed: [UInt32] = [S_IFREG, S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK].map { UInt32($0) }
        guard type == 0 || allowed.contains(type) else { throw FSError.invalid }
        let c = try claim([parent], .write)
        defer { coordinator.release(c) }
        let a = try inodes.locked { t in
            attributes(try makeNode(in: try t.directory(parent), of: t, name: name, type: type == 0 ? UInt32(S_IFREG) : type,
                                    perm: mode, caller: caller, rdev: (type == UInt32(S_IFCHR) || type == UInt32(S_IFBLK)) ? rdev : 0))
        }
        kickUploader()
        emit(.changed, a.ino)
        return a
    }

    public func symlink(_ target: [UInt8], _ parent: UInt64, _ name: [UInt8], caller: Caller) throws -> Attributes {
        if target.count > 4095 { throw FSError.nameTooLong }
        let c = try claim([parent], .write)
        defer { coordinator.release(c) }
        let a = try inodes.locked { t in
            attributes(try makeNode(in: try t.directory(parent), of: t, name: name, type: UInt32(S_IFLNK), perm: 0o777,
                                    caller: caller, target: target))
        }
        kickUploader()
        emit(.changed, a.ino)
        return a
    }

    /// create(2) with O_CREAT: makes the file (or opens it if it exists and
    /// O_EXCL is not set) and opens it. Returns its attributes and a handle.
    public func create(_ parent: UInt64, _ name: [UInt8], mode: UInt32, flags: Int32,
                       caller: Caller, clearSetID: SetIDClearing? = nil) throws -> (Attributes, UInt64) {
        let made = try createOrOpen(parent, name, mode: mode, flags: flags, caller: caller, clearSetID: clearSetID)
        return (made.attributes, made.handle)
    }

    /// `create`, saying whether it made the file (`isNew`) or opened one that was there.
    public func createOrOpen(_ parent: UInt64, _ name: [UInt8], mode: UInt32, flags: Int32, caller: Caller,
                             clearSetID: SetIDClearing? = nil) throws -> (attributes: Attributes, handle: UInt64, isNew: Bool) {
        let c = try claim([parent], .write)
        var existing: UInt64?
        let made: (Attributes, UInt64)? = try {
            defer { coordinator.release(c) }
            return try inodes.locked { t in
                let dir = try t.directory(parent)
                if let ino = dir.children[name] {
                    if flags & O_EXCL != 0 { throw FSError.exists }
                    existing = ino
                    return nil
                }
                var fd: Int32 = -1
                let n = try makeNode(in: dir, of: t, name: name, type: UInt32(S_IFREG), perm: mode, caller: caller, openFD: &fd,
                                     deferRows: true)
                n.unpersisted = true  // the first close makes the new file durable
                return (attributes(n), adoptHandle(n, t, fd: fd, flags: flags & ~(O_TRUNC | O_CREAT | O_EXCL)))
            }
        }()
        if let made {
            // (Nothing queued yet: the close queues the upload and kicks the uploader.) The path
            // from the folder's: the file's own rows wait for a transaction (`deferCreate`).
            if events.wants(.changed), let dir = pathBytes(of: parent) { emit(.changed, made.0.ino, path: Self.join(dir, name)) }
            return (made.0, made.1, true)
        }
        // Opening an existing file through create: count the lookup as the kernel will.
        let fh = try open(existing!, flags: flags & ~(O_CREAT | O_EXCL), clearSetID: clearSetID)
        let a = try inodes.locked { t -> Attributes in
            let n = try t.node(existing!)
            n.lookups += 1
            return attributes(n)
        }
        return (a, fh, false)
    }

    public func link(_ ino: UInt64, _ newParent: UInt64, _ newName: [UInt8]) throws -> Attributes {
        try Self.validate(name: newName)
        try Self.checkNotReserved(parent: newParent, name: newName)
        let c = try claim([ino, newParent], .write)
        defer { coordinator.release(c) }
        let a = try inodes.locked { t in
            let n = try t.node(ino)
            if n.isDirectory { throw FSError.notPermitted }
            let dir = try t.directory(newParent)
            if dir.children[newName] != nil { throw FSError.exists }
            if n.nlink == 0 { throw FSError.notFound }
            if n.nlink >= 65000 { throw FSError.tooManyLinks }
            let now = nowNanos()
            n.rec.ctimeNs = now
            dir.rec.mtimeNs = now
            dir.rec.ctimeNs = now
            let delay = uploadDelay
            try persist { tx in
                tx.insertEntry(parent: newParent, name: newName, ino: ino)
                tx.upsert(n.rec)
                tx.upsert(dir.rec)
                tx.enqueue(ino, delay: delay)
            }
            dir.children[newName] = ino
            n.nlink += 1
            n.lookups += 1
            return attributes(n)
        }
        kickUploader()
        emit(.changed, a.ino)
        return a
    }

    /// Resolves `name` under `parent` now, for claiming before the change.
    private func peek(_ parent: UInt64, _ name: [UInt8]) throws -> UInt64 {
        try inodes.locked { t in
            guard let ino = try t.directory(parent).children[name] else { throw FSError.notFound }
            return ino
        }
    }

    public func unlink(_ parent: UInt64, _ name: [UInt8]) throws {
        try removeName(parent, name, directory: false)
    }

    public func rmdir(_ parent: UInt64, _ name: [UInt8]) throws {
        if name == [UInt8(ascii: ".")] { throw FSError.invalid }
        if name == [UInt8(ascii: "."), UInt8(ascii: ".")] { throw FSError.notEmpty }
        try removeName(parent, name, directory: true)
    }

    private func removeName(_ parent: UInt64, _ name: [UInt8], directory wantDir: Bool) throws {
        if name.count > maxNameBytes { throw FSError.nameTooLong }
        let gone = events.wants(.deleted) ? pathBytes(of: parent).map { Self.join($0, name) } : nil
        var removed: UInt64 = 0
        while true {
            let target = try peek(parent, name)
            let c = try claim([parent, target], .delete)
            defer { coordinator.release(c) }
            let done: Bool = try inodes.locked { t in
                let dir = try t.directory(parent)
                guard dir.children[name] == target else { return false }  // changed meanwhile: again
                let n = try t.node(target)
                if wantDir {
                    if !n.isDirectory { throw FSError.notDirectory }
                    if !n.children.isEmpty { throw FSError.notEmpty }
                } else if n.isDirectory {
                    throw FSError.isDirectory
                }
                let now = nowNanos()
                dir.rec.mtimeNs = now
                dir.rec.ctimeNs = now
                n.rec.ctimeNs = now
                // Its last name, and nothing has it open: its rows go in the same transaction,
                // not in one of their own at the kernel's `forget` (rm -rf: one commit a file).
                let dropRows = n.losesRowsWithThisName
                try persist { tx in
                    tx.removeEntry(parent: parent, name: name)
                    tx.upsert(dir.rec)
                    if n.nlink > 1 && !n.isDirectory { tx.upsert(n.rec) }
                    if dropRows { tx.deleteInode(target) }
                }
                n.rowsDeleted = dropRows
                dir.children[name] = nil
                if n.isDirectory {
                    n.nlink = 0
                    dir.nlink -= 1
                } else {
                    n.nlink -= 1
                }
                removed = target
                reapIfUnreferenced(n, t)
                return true
            }
            if done { break }
        }
        kickUploader()
        if let gone { emit(.deleted, removed, path: gone) }
    }

    /// `name` under the folder path `dir` (empty: the root).
    static func join(_ dir: [UInt8], _ name: [UInt8]) -> [UInt8] {
        dir.isEmpty ? name : dir + [UInt8(ascii: "/")] + name
    }

    /// rename(2) and renameat2(2) with RENAME_NOREPLACE / RENAME_EXCHANGE.
    public func rename(_ parent: UInt64, _ name: [UInt8], _ newParent: UInt64, _ newName: [UInt8],
                       flags: RenameFlags = []) throws {
        if flags.contains(.whiteout) || (flags.contains(.exchange) && flags.contains(.noReplace)) {
            throw FSError.invalid
        }
        if name.count > maxNameBytes || newName.count > maxNameBytes { throw FSError.nameTooLong }
        try Self.validate(name: newName)
        try Self.checkNotReserved(parent: newParent, name: newName)
        if folderLevels.withLock({ $0 }) != nil, let src = try? peek(parent, name), inodes.locked({ t in t[src]?.isDirectory }) == true {
            try checkFolderLevels(parent: newParent, name: newName)
        }
        let from = events.wants(.moved) ? pathBytes(of: parent).map { Self.join($0, name) } : nil
        var moved: UInt64 = 0
        while true {
            let src = try peek(parent, name)
            moved = src
            let dst = try? peek(newParent, newName)
            var items = [parent, newParent, src]
            if let dst { items.append(dst) }
            let c = try claim(items, .move)
            defer { coordinator.release(c) }
            let done = try inodes.locked { t in try rename(in: t, parent, name, newParent, newName, flags, src: src, dst: dst) }
            if done { break }
        }
        kickUploader()
        if let from { emit(.moved, moved, path: pathBytes(of: newParent).map { Self.join($0, newName) }, from: from) }
    }

    private func rename(in t: Inodes, _ parent: UInt64, _ name: [UInt8], _ newParent: UInt64, _ newName: [UInt8],
                              _ flags: RenameFlags, src: UInt64, dst: UInt64?) throws -> Bool {
        let fromDir = try t.directory(parent)
        let toDir = try t.directory(newParent)
        guard fromDir.children[name] == src, toDir.children[newName] == dst else { return false }
        let s = try t.node(src)
        if toDir.nlink == 0 { throw FSError.notFound }
        // A directory may not move into itself or below itself.
        if s.isDirectory, t.isInside(newParent, src) { throw FSError.invalid }
        let now = nowNanos()
        if flags.contains(.exchange) {
            guard let dst else { throw FSError.notFound }
            let d = try t.node(dst)
            if d.isDirectory, dst != src, t.isInside(parent, dst) { throw FSError.invalid }
            if src == dst { return true }
            for n in [s, d, fromDir, toDir] { n.rec.ctimeNs = now }
            fromDir.rec.mtimeNs = now
            toDir.rec.mtimeNs = now
            let moved = t.subtree(src) + t.subtree(dst)
            try persist { tx in
                tx.exchangeEntries((parent, name), (newParent, newName))
                for n in [s, d, fromDir, toDir] { tx.upsert(n.rec) }
                for i in moved { tx.enqueue(i) }
            }
            fromDir.children[name] = dst
            toDir.children[newName] = src
            if s.isDirectory { s.parent = newParent }
            if d.isDirectory { d.parent = parent }
            if s.isDirectory != d.isDirectory, parent != newParent {
                if s.isDirectory { fromDir.nlink -= 1; toDir.nlink += 1 } else { toDir.nlink -= 1; fromDir.nlink += 1 }
            }
            return true
        }
        var replaced: Node?
        if let dst {
            if flags.contains(.noReplace) { throw FSError.exists }
            if dst == src { return true }  // two names of one inode: rename does nothing
            let d = try t.node(dst)
            if s.isDirectory {
                if !d.isDirectory { throw FSError.notDirectory }
                if !d.children.isEmpty { throw FSError.notEmpty }
            } else if d.isDirectory {
                throw FSError.isDirectory
            }
            replaced = d
        }
        s.rec.ctimeNs = now
        fromDir.rec.mtimeNs = now
        fromDir.rec.ctimeNs = now
        toDir.rec.mtimeNs = now
        toDir.rec.ctimeNs = now
        if let r = replaced { r.rec.ctimeNs = now }
        let moved = t.subtree(src)
        // A replaced file's last name, and nothing has it open: its rows go now (see removeName).
        let dropReplaced = replaced?.losesRowsWithThisName ?? false
        try persist { tx in
            if replaced != nil { tx.removeEntry(parent: newParent, name: newName) }
            tx.moveEntry(parent: parent, name: name, toParent: newParent, toName: newName)
            tx.upsert(s.rec)
            tx.upsert(fromDir.rec)
            if newParent != parent { tx.upsert(toDir.rec) }
            if let r = replaced, !r.isDirectory, r.nlink > 1 { tx.upsert(r.rec) }
            if let r = replaced, dropReplaced { tx.deleteInode(r.rec.ino) }
            for i in moved { tx.enqueue(i) }
        }
        replaced?.rowsDeleted = dropReplaced
        fromDir.children[name] = nil
        toDir.children[newName] = src
        if let r = replaced {
            if r.isDirectory { r.nlink = 0; toDir.nlink -= 1 } else { r.nlink -= 1 }
            reapIfUnreferenced(r, t)
        }
        if s.isDirectory {
            s.parent = newParent
            if parent != newParent { fromDir.nlink -= 1; toDir.nlink += 1 }
        }
        return true
    }

    // MARK: - Directories

    /// Opens a directory, taking the listing that readdir will page through.
    public func opendir(_ ino: UInt64) throws -> UInt64 {
        try inodes.locked { t in
            let h = Handle(ino: ino, fd: -1, flags: O_RDONLY)
            h.listing = try listing(of: ino, t)
            return t.add(h)
        }
    }

    /// What a directory handle pages through: `.`, `..` and the names `ino` holds now.
    private func listing(of ino: UInt64, _ t: Inodes) throws -> [DirEntry] {
        let dir = try t.directory(ino)
        var list: [DirEntry] = [
            DirEntry(name: [UInt8(ascii: ".")], ino: ino, type: UInt32(S_IFDIR), nextOffset: 1),
            DirEntry(name: [UInt8(ascii: "."), UInt8(ascii: ".")], ino: dir.parent, type: UInt32(S_IFDIR), nextOffset: 2),
        ]
        list.reserveCapacity(dir.children.count + 2)
        // The files' nodes read in at once (readdirplus asks for each next), or, in a folder
        // too large for that, the types of those not in memory in one query.
        t.readInChildren(of: dir)
        var stored: [UInt64: UInt32]?
        for (name, child) in dir.children {
            var type = t.resident(child)?.rec.type
            if type == nil {
                if stored == nil { stored = (try? state.read { tx in try tx.childTypes(of: ino) }) ?? [:] }
                type = stored?[child]
            }
            list.append(DirEntry(name: name, ino: child, type: type ?? UInt32(S_IFREG), nextOffset: Int64(list.count + 1)))
        }
        return list
    }

    /// Entries from `offset` on (0: from the start), at most `limit`. A read from the start
    /// after others (`rewinddir`, or a seek to 0) takes the listing again: POSIX has a rewound
    /// stream show the directory as it is now.
    public func readdir(_ fh: UInt64, offset: Int64, limit: Int = .max) throws -> [DirEntry] {
        try inodes.locked { t in
            guard let h = t.handle(fh) else { throw FSError.badHandle }
            if offset <= 0 && h.listingRead { h.listing = try listing(of: h.ino, t) }
            h.listingRead = true
            let start = Int(max(0, offset))
            if start >= h.listing.count { return [] }
            return Array(h.listing[start ..< min(h.listing.count, start + min(limit, h.listing.count))])
        }
    }

    /// For readdirplus: the attributes of a listed entry, counting a lookup.
    /// Nil if it was removed since the listing was taken.
    public func lookupListed(_ entry: DirEntry, in parent: UInt64) -> Attributes? {
        inodes.locked { t in
            guard let n = t[entry.ino], n.nlink > 0 else { return nil }
            n.lookups += 1
            return attributes(n)
        }
    }

    public func releasedir(_ fh: UInt64) {
        _ = inodes.locked { t in t.removeHandle(fh) }
    }
}

/// How deep folders may go (a container's folder levels): `max` levels below the root, or
/// below `under` (`Documents`, when a mount shows a container's data too).
public struct FolderLevels: Sendable, Equatable {
    public var max: Int
    public var under: String?
    public init(max: Int, under: String?) { self.max = max; self.under = under }
}

extension FileSystem {
    /// Refuses (EPERM, and a log line) a folder `name` in `parent` deeper than the folder levels allow.
    func checkFolderLevels(parent: UInt64, name: [UInt8]) throws {
        guard let rule = folderLevels.withLock({ $0 }), let p = path(of: parent) else { return }
        var parts = p.split(separator: "/").map(String.init)
        if let under = rule.under {
            guard parts.first == under else { return }  // the data scope, or `under` itself
            parts.removeFirst()
        }
        if parts.count + 1 > rule.max {
            let shown = String(decoding: Self.join(Array(p.utf8), name), as: UTF8.self)
            logger.warning("refused folder \(shown): this container allows \(rule.max == 0 ? "no folders" : "\(rule.max) folder level\(rule.max == 1 ? "" : "s")")\(rule.under.map { " in \($0)" } ?? "")")
            throw FSError.notPermitted
        }
    }
}
