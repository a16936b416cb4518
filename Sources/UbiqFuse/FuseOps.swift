import CFuse
import CUbiqFuse
import Foundation
import UbiqFS

// setattr(2) `to_set` bits (fuse_lowlevel.h FUSE_SET_ATTR_*).
private let setMode: Int32 = 1 << 0, setUID: Int32 = 1 << 1, setGID: Int32 = 1 << 2, setSize: Int32 = 1 << 3
private let setATime: Int32 = 1 << 4, setMTime: Int32 = 1 << 5, setATimeNow: Int32 = 1 << 7, setMTimeNow: Int32 = 1 << 8

/// The operation table: one small function per libfuse low-level operation.
enum FuseOps {
    static func install(_ ops: inout fuse_lowlevel_ops) {
        installSession(&ops)
        installNames(&ops)
        installFiles(&ops)
        installFolders(&ops)
        installAttributes(&ops)
    }

    /// The session's start, and what the kernel asks of an inode it knows: lookup, forget, attributes, a symlink's target.
    private static func installSession(_ ops: inout fuse_lowlevel_ops) {
        ops.`init` = { userdata, conn in
            let s = Unmanaged<FuseServer>.fromOpaque(userdata!).takeUnretainedValue()
            ubiq_conn_configure(conn, s.options.maxWrite)
            cubiqfuse_init_reply_follows()
        }
        ops.lookup = { req, parent, n in
            OpStats.measure("lookup") {
                let s = FuseServer.from(req)
                let nm = name(n)
                let found: (Attributes, timeout: Double)
                do {
                    // `.` and `..`: the kernel finds an item by its handle (`FileSystem.lookup`),
                    // for a caller it let do so (CAP_DAC_READ_SEARCH): no folder to search.
                    let byHandle = nm == [UInt8(ascii: ".")] || nm == [UInt8(ascii: "."), UInt8(ascii: ".")]
                    let folder = byHandle ? nil : try s.permit(req, parent, PermissionRules.exec)
                    found = (try s.fs.lookup(parent, nm), s.entryTimeout(in: folder, req))
                } catch FSError.notFound where s.fs.notListedYet(nm, in: parent) {
                    // A name a new device's listing of the store has not reached yet: answered
                    // once it has, from a thread of its own (the listing may take a minute).
                    s.answer(req, later: true) { req in
                        s.replyEntry(req) {
                            let folder = try s.permit(req, parent, PermissionRules.exec)
                            return (try s.fs.lookup(parent, nm, waitingForTheListing: true), s.entryTimeout(in: folder, req))
                        }
                    }
                    return
                } catch {
                    s.replyError(req, error)
                    return
                }
                s.replyEntry(req) { found }
            }
        }
        ops.forget = { req, ino, count in
            OpStats.measure("forget") {
                FuseServer.from(req).fs.forget(ino, count)
                fuse_reply_none(req)
            }
        }
        ops.forget_multi = { req, count, forgets in
            OpStats.measure("forget_multi") {
                let fs = FuseServer.from(req).fs
                for i in 0 ..< count { fs.forget(forgets![i].ino, forgets![i].nlookup) }
                fuse_reply_none(req)
            }
        }
        ops.getattr = { req, ino, _ in
            OpStats.measure("getattr") {
                let s = FuseServer.from(req)
                s.replyAttr(req) { try s.fs.getattr(ino) }
            }
        }
        ops.setattr = { req, ino, attr, toSet, fi in
            OpStats.measure("setattr") {
                let s = FuseServer.from(req)
                let st = attr!.pointee
                let fh = fi?.pointee.fh
                var ch = AttributeChanges(clearSetID: setIDClearing(req))
                if toSet & setMode != 0 { ch.mode = st.st_mode }
                if toSet & setUID != 0 { ch.uid = st.st_uid }
                if toSet & setGID != 0 { ch.gid = st.st_gid }
                if toSet & setSize != 0 { ch.size = Int64(st.st_size) }
                if toSet & setATimeNow != 0 { ch.atime = .now } else if toSet & setATime != 0 {
                    ch.atime = .at(withUnsafePointer(to: st) { ubiq_stat_atime($0) })
                }
                if toSet & setMTimeNow != 0 { ch.mtime = .now } else if toSet & setMTime != 0 {
                    ch.mtime = .at(withUnsafePointer(to: st) { ubiq_stat_mtime($0) })
                }
                do { ch = try s.permitted(req, ch, of: ino, throughHandle: fh != nil) } catch { s.replyError(req, error); return }
                let slow = toSet & setSize != 0 && s.fs.waitsForStore(ino, size: Int64(st.st_size))
                let change = ch
                s.answer(req, later: slow) { req in s.replyAttr(req) {
                    try s.fs.setattr(ino, change, fh: fh, caller: caller(req))
                } }
            }
        }
        ops.readlink = { req, ino in
            OpStats.measure("readlink") {
                let s = FuseServer.from(req)
                do {
                    var t = try s.fs.readlink(ino)
                    t.append(0)
                    t.withUnsafeBufferPointer { b in
                        b.withMemoryRebound(to: CChar.self) { _ = fuse_reply_readlink(req, $0.baseAddress) }
                    }
                } catch { s.replyError(req, error) }
            }
        }
    }

    /// Names made, removed and moved.
    private static func installNames(_ ops: inout fuse_lowlevel_ops) {
        ops.mknod = { req, parent, n, mode, rdev in
            OpStats.measure("mknod") {
                let s = FuseServer.from(req)
                s.replyEntry(req) {
                    let folder = try s.permitNewName(req, parent, name(n))
                    return (try s.fs.mknod(parent, name(n), mode: mode, rdev: UInt64(rdev), caller: caller(req)), s.entryTimeout(in: folder, req))
                }
            }
        }
        ops.mkdir = { req, parent, n, mode in
            OpStats.measure("mkdir") {
                let s = FuseServer.from(req)
                s.replyEntry(req) {
                    let folder = try s.permitNewName(req, parent, name(n))
                    return (try s.fs.mkdir(parent, name(n), mode: mode, caller: caller(req)), s.entryTimeout(in: folder, req))
                }
            }
        }
        ops.unlink = { req, parent, n in
            OpStats.measure("unlink") {
                let s = FuseServer.from(req)
                s.replyOK(req) {
                    try s.permitRemoval(req, parent, name(n))
                    try s.fs.unlink(parent, name(n))
                }
            }
        }
        ops.rmdir = { req, parent, n in
            OpStats.measure("rmdir") {
                let s = FuseServer.from(req)
                s.replyOK(req) {
                    try s.permitRemoval(req, parent, name(n))
                    try s.fs.rmdir(parent, name(n))
                }
            }
        }
        ops.symlink = { req, link, parent, n in
            OpStats.measure("symlink") {
                let s = FuseServer.from(req)
                s.replyEntry(req) {
                    let folder = try s.permitNewName(req, parent, name(n))
                    return (try s.fs.symlink(name(link), parent, name(n), caller: caller(req)), s.entryTimeout(in: folder, req))
                }
            }
        }
        ops.rename = { req, parent, n, newParent, newName, flags in
            OpStats.measure("rename") {
                let s = FuseServer.from(req)
                s.replyOK(req) {
                    let flags = RenameFlags(rawValue: flags)
                    try s.permitRename(req, parent, name(n), newParent, name(newName), flags: flags)
                    try s.fs.rename(parent, name(n), newParent, name(newName), flags: flags)
                }
            }
        }
        ops.link = { req, ino, newParent, newName in
            OpStats.measure("link") {
                let s = FuseServer.from(req)
                s.replyEntry(req) {
                    let folder = try s.permitNewName(req, newParent, name(newName))
                    try s.permitLinking(req, ino)
                    return (try s.fs.link(ino, newParent, name(newName)), s.entryTimeout(in: folder, req))
                }
            }
        }
    }

    /// A file's handles: opened (open, create), then read and written (`installFileIO`).
    private static func installFiles(_ ops: inout fuse_lowlevel_ops) {
        installFileIO(&ops)
        ops.open = { req, ino, fi in
            OpStats.measure("open") {
                let s = FuseServer.from(req)
                let flags = ubiq_fi_flags(fi)
                // libfuse's `fi` lives only as long as this call: a later answer uses a copy.
                let info = FileInfo(fi!.pointee)
                let clearSetID = setIDClearing(req)
                do { try s.permit(req, ino, PermissionRules.forOpen(flags: flags)) } catch { s.replyError(req, error); return }
                // The kernel may hold a size the file does not have: it looks again first, or
                // this handle skips its page cache.
                let who = caller(req)
                let size = s.fs.kernelSizeAtOpen(ino, pid: who.pid)
                if size == .lookAgain { fuse_reply_err(req, ESTALE); return }
                if size == .gone { s.fs.openAnswered(pid: who.pid); fuse_reply_err(req, ENOENT); return }
                s.answer(req, later: s.fs.waitsForStore(ino, flags: flags)) { req in
                    do {
                        let fh = try s.fs.open(ino, flags: flags, caller: who, clearSetID: clearSetID)
                        var fi = info.value
                        fi.fh = fh
                        ubiq_fi_set_keep_cache(&fi, 1)
                        if size == .unsure { ubiq_fi_set_direct_io(&fi, 1) }
                        s.fs.openAnswered(pid: who.pid)
                        if fuse_reply_open(req, &fi) != 0 { s.fs.release(fh) }
                    } catch FSError.stale where !s.fs.mayAnswerStale(pid: who.pid) {
                        // The kernel's retry (`FileSystem.mayAnswerStale`): the file went as it opened.
                        s.fs.openAnswered(pid: who.pid)
                        fuse_reply_err(req, ENOENT)
                    } catch FSError.stale {
                        fuse_reply_err(req, ESTALE)
                    } catch {
                        s.fs.openAnswered(pid: who.pid)
                        s.replyError(req, error)
                    }
                }
            }
        }
        ops.create = { req, parent, n, mode, fi in
            OpStats.measure("create") {
                let s = FuseServer.from(req)
                do {
                    let flags = ubiq_fi_flags(fi)
                    let folder = try s.permitCreate(req, parent, name(n), flags: flags)
                    let (a, fh, isNew) = try s.fs.createOrOpen(parent, name(n), mode: mode, flags: flags, caller: caller(req),
                                                                clearSetID: setIDClearing(req))
                    fi!.pointee.fh = fh
                    ubiq_fi_set_keep_cache(fi, 1)
                    // A new file opened only for writing: its writes skip the kernel's page cache
                    // (none of it holds this file yet, and the handle can neither read nor map
                    // it). The kernel then asks for no `security.capability` before its first
                    // write (ubiq clears that itself, as FUSE_HANDLE_KILLPRIV_V2 requires), and
                    // copies no page: docs/kernel-options.md.
                    if isNew && (flags & O_ACCMODE) == O_WRONLY { ubiq_fi_set_direct_io(fi, 1) }
                    var e = s.entry(a, timeout: s.entryTimeout(in: folder, req))
                    if fuse_reply_create(req, &e, fi) != 0 {
                        s.fs.release(fh)
                        s.fs.forget(a.ino, 1)
                    }
                } catch { s.replyError(req, error) }
            }
        }
    }

    /// What an open handle does: read, write, flush, release, sync, allocate, seek.
    private static func installFileIO(_ ops: inout fuse_lowlevel_ops) {
        ops.read = { req, _, size, off, fi in
            OpStats.measure("read") {
                // Answered here when the bytes are local, else later from the thread that
                // brought them: a read that waits for the store holds no worker thread.
                let s = FuseServer.from(req)
                let buf = ReadBuffer(malloc(max(size, 1))!)
                let pending = s.replyLater(req)
                s.fs.read(fi!.pointee.fh, offset: Int64(off), count: size, into: buf) { result in
                    switch result {
                    case .success(let n): fuse_reply_buf(pending.req, buf.pointer.assumingMemoryBound(to: CChar.self), n)
                    case .failure(let e): s.replyError(pending.req, e)
                    }
                    free(buf.pointer)
                    s.replied(pending)
                }
            }
        }
        ops.write = { req, _, data, size, off, fi in
            OpStats.measure("write") {
                let s = FuseServer.from(req)
                do {
                    let n = try s.fs.write(fi!.pointee.fh, offset: Int64(off), count: size, from: UnsafeRawPointer(data!),
                                           clearSetID: setIDClearing(req))
                    fuse_reply_write(req, n)
                } catch { s.replyError(req, error) }
            }
        }
        ops.flush = { req, _, fi in
            OpStats.measure("flush") {
                let s = FuseServer.from(req)
                s.replyOK(req) { try s.fs.flush(fi!.pointee.fh) }
            }
        }
        ops.release = { req, _, fi in
            OpStats.measure("release") {
                FuseServer.from(req).fs.release(fi!.pointee.fh)
                fuse_reply_err(req, 0)
            }
        }
        ops.fsync = { req, _, datasync, fi in
            OpStats.measure("fsync") {
                let s = FuseServer.from(req)
                s.replyOK(req) { try s.fs.fsync(fi!.pointee.fh, dataOnly: datasync != 0) }
            }
        }
        ops.fallocate = { req, _, mode, off, len, fi in
            OpStats.measure("fallocate") {
                let s = FuseServer.from(req)
                // With KILLPRIV_V2 the kernel leaves setuid/setgid to the file system but flags
                // no fallocate: not root stands for "without CAP_FSETID" here.
                let clearSetID = cubiqfuse_killpriv_v2() != 0 && caller(req).uid != 0 ? setIDClearing(req, always: true) : nil
                s.replyOK(req) {
                    try s.fs.fallocate(fi!.pointee.fh, mode: mode, offset: Int64(off), length: Int64(len), clearSetID: clearSetID)
                }
            }
        }
        // SEEK_DATA and SEEK_HOLE (the kernel answers SEEK_SET, SEEK_CUR and SEEK_END itself).
        ops.lseek = { req, _, off, whence, fi in
            OpStats.measure("lseek") {
                let s = FuseServer.from(req)
                do {
                    fuse_reply_lseek(req, off_t(try s.fs.seek(fi!.pointee.fh, offset: Int64(off), whence: whence)))
                } catch { s.replyError(req, error) }
            }
        }
    }

    /// A folder's handles: its listing.
    private static func installFolders(_ ops: inout fuse_lowlevel_ops) {
        ops.opendir = { req, ino, fi in
            OpStats.measure("opendir") {
                let s = FuseServer.from(req)
                do {
                    try s.permit(req, ino, PermissionRules.read)
                    fi!.pointee.fh = try s.fs.opendir(ino)
                    fuse_reply_open(req, fi)
                } catch { s.replyError(req, error) }
            }
        }
        ops.readdir = { req, ino, size, off, fi in
            OpStats.measure("readdir") {
                FuseServer.from(req).readdir(req, ino, size, off, fi!.pointee.fh, plus: false)
            }
        }
        ops.readdirplus = { req, ino, size, off, fi in
            OpStats.measure("readdirplus") {
                FuseServer.from(req).readdir(req, ino, size, off, fi!.pointee.fh, plus: true)
            }
        }
        ops.releasedir = { req, _, fi in
            OpStats.measure("releasedir") {
                FuseServer.from(req).fs.releasedir(fi!.pointee.fh)
                fuse_reply_err(req, 0)
            }
        }
        ops.fsyncdir = { req, _, _, _ in
            OpStats.measure("fsyncdir") {
                let s = FuseServer.from(req)
                s.replyOK(req) { try s.fs.syncState() }
            }
        }
    }

    /// The file system's figures, extended attributes, access checks.
    private static func installAttributes(_ ops: inout fuse_lowlevel_ops) {
        ops.statfs = { req, _ in
            OpStats.measure("statfs") {
                let s = FuseServer.from(req)
                let st = s.fs.statfs()
                var v = statvfs()
                v.f_bsize = UInt(st.blockSize)
                v.f_frsize = UInt(st.blockSize)
                v.f_blocks = UInt(st.blocks)
                v.f_bfree = UInt(st.blocksFree)
                v.f_bavail = UInt(st.blocksAvailable)
                v.f_files = UInt(st.files)
                v.f_ffree = UInt(st.filesFree)
                v.f_favail = UInt(st.filesFree)
                v.f_namemax = UInt(st.nameMax)
                fuse_reply_statfs(req, &v)
            }
        }
        ops.setxattr = { req, ino, n, value, size, flags in
            OpStats.measure("setxattr") {
                let s = FuseServer.from(req)
                s.replyOK(req) {
                    let v = size > 0 ? Array(UnsafeRawBufferPointer(start: value, count: size)) : []
                    let mode: XattrSetMode = flags & 1 != 0 ? .create : (flags & 2 != 0 ? .replace : .any)
                    try s.permit(req, ino, PermissionRules.forXattr(name(n), write: true))
                    try s.fs.setxattr(ino, name(n), v, mode: mode)
                }
            }
        }
        ops.getxattr = { req, ino, n, size in
            OpStats.measure("getxattr") {
                let s = FuseServer.from(req)
                do {
                    try s.permit(req, ino, PermissionRules.forXattr(name(n), write: false))
                    s.replyXattr(req, try s.fs.getxattr(ino, name(n)), size)
                } catch { s.replyError(req, error) }
            }
        }
        ops.listxattr = { req, ino, size in
            OpStats.measure("listxattr") {
                let s = FuseServer.from(req)
                do {
                    var out: [UInt8] = []
                    for n in try s.fs.listxattr(ino) { out += n; out.append(0) }
                    s.replyXattr(req, out, size)
                } catch { s.replyError(req, error) }
            }
        }
        ops.removexattr = { req, ino, n in
            OpStats.measure("removexattr") {
                let s = FuseServer.from(req)
                s.replyOK(req) {
                    try s.permit(req, ino, PermissionRules.forXattr(name(n), write: true))
                    try s.fs.removexattr(ino, name(n))
                }
            }
        }
        ops.access = { req, ino, mask in
            OpStats.measure("access") {
                let s = FuseServer.from(req)
                s.replyOK(req) { try s.fs.access(ino, mask: mask, who: credentials(req)) }
            }
        }
    }
}

extension FuseServer {
    func replyXattr(_ req: fuse_req_t?, _ value: [UInt8], _ size: Int) {
        if size == 0 { fuse_reply_xattr(req, value.count); return }
        if value.count > size { fuse_reply_err(req, ERANGE); return }
        value.withUnsafeBufferPointer { b in
            b.withMemoryRebound(to: CChar.self) { _ = fuse_reply_buf(req, $0.baseAddress, value.count) }
        }
    }

    func readdir(_ req: fuse_req_t?, _ ino: UInt64, _ size: Int, _ off: Int, _ fh: UInt64, plus: Bool) {
        do {
            // On a mount ubiq checks, names in a folder the caller may not search are listed
            // without attributes: the kernel then holds none of them to walk through.
            let folder = plus && checks == .daemon ? try fs.getattr(ino) : nil
            let attributes = maySearch(req, folder)
            let timeout = entryTimeout(in: folder, req)
            let entries = try fs.readdir(fh, offset: Int64(off), limit: max(1, size / 32))
            let buf = malloc(max(size, 1))!.assumingMemoryBound(to: CChar.self)
            defer { free(buf) }
            var used = 0
            for d in entries {
                var nameC = d.name
                nameC.append(0)
                let added: Int = nameC.withUnsafeBufferPointer { nb in
                    nb.withMemoryRebound(to: CChar.self) { np in
                        if plus {
                            let isDot = d.name == [46] || d.name == [46, 46]
                            var e = fuse_entry_param()
                            var counted = false
                            if isDot || !attributes {
                                e.attr.st_ino = UInt(d.ino)
                                e.attr.st_mode = d.type
                            } else if let a = fs.lookupListed(d, in: ino) {
                                e = entry(a, timeout: timeout)
                                counted = true
                            } else {
                                return 0  // removed since opendir: skip it
                            }
                            let need = fuse_add_direntry_plus(req, buf + used, size - used, np.baseAddress, &e, off_t(d.nextOffset))
                            if need > size - used {
                                if counted { fs.forget(d.ino, 1) }
                                return -1
                            }
                            return need
                        } else {
                            var st = Glibc.stat()
                            st.st_ino = UInt(d.ino)
                            st.st_mode = d.type
                            let need = fuse_add_direntry(req, buf + used, size - used, np.baseAddress, &st, off_t(d.nextOffset))
                            return need > size - used ? -1 : need
                        }
                    }
                }
                if added < 0 { break }
                used += added
            }
            fuse_reply_buf(req, buf, used)
        } catch { replyError(req, error) }
    }
}
