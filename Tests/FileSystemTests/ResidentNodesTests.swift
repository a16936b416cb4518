import Foundation
import Testing
import TestSupport
@testable import UbiqFS
import UbiqState

/// Nodes of files leave memory past a limit and are read from the state database again when
/// asked for (`Inodes`): nothing a file is may be lost on the way, the kernel's references
/// to it are kept without its node, and the counts the mount shows are of every item.
@Suite struct ResidentNodesTests {
    /// What `stat`, `readlink`, `getfattr` and `cat` say of an item.
    func look(_ d: Device, _ path: String) throws -> String {
        let ino = try d.ino(path)
        let a = try d.fs.getattr(ino)
        var out = "\(a.mode) \(a.nlink) \(a.uid):\(a.gid) \(a.size) \(a.blocks) \(a.mtime) \(a.ctime)"
        if a.type == UInt32(S_IFLNK) { out += " -> " + String(decoding: try d.fs.readlink(ino), as: UTF8.self) }
        for name in try d.fs.listxattr(ino).sorted(by: { $0.lexicographicallyPrecedes($1) }) {
            out += " " + String(decoding: name, as: UTF8.self) + "=" + String(decoding: try d.fs.getxattr(ino, name), as: UTF8.self)
        }
        if a.type == UInt32(S_IFREG) { out += " " + (try d.read(path)) }
        return out
    }

    @Test func filesLeaveMemoryAndComeBackWhole() throws {
        let d = try Device(store: try newStore(), residentNodes: 5)
        try d.mkdir("dir")
        var paths: [String] = []
        for i in 0 ..< 60 {
            let path = "dir/f\(i)"
            try d.write(path, "content \(i)")
            paths.append(path)
        }
        let f0 = try d.ino("dir/f0")
        _ = try d.fs.setattr(f0, AttributeChanges(mode: 0o600, uid: 7, gid: 8), caller: .root)
        try d.fs.setxattr(try d.ino("dir/f1"), n("user.tag"), n("blue"), mode: .any)
        _ = try d.fs.link(try d.ino("dir/f2"), try d.ino("dir"), n("f2-link"))
        _ = try d.fs.symlink(n("f3"), try d.ino("dir"), n("to-f3"), caller: .root)
        paths += ["dir/f2-link", "dir/to-f3"]
        _ = try d.fs.mknod(try d.ino("dir"), n("fifo"), mode: UInt32(S_IFIFO) | 0o644, rdev: 0, caller: .root)
        paths.append("dir/fifo")
        try d.fs.syncState()
        let before = try paths.map { try look(d, $0) }

        // Every look counted a lookup (the kernel's references): most nodes left memory since.
        let resident = d.fs.residentNodes
        #expect(resident.evicted > 0 && resident.count < 30, "nodes in memory: \(resident)")
        #expect(try paths.map { try look(d, $0) } == before, "a node read in again differs")
        #expect(d.fs.nodeCheckFailures.withLock { $0 } == 0)
        // The listing's types without reading each node in.
        #expect(try d.names("dir").count == 63)
        #expect(d.fs.inodeCount == 64, "items: every one, in memory or not (62 in dir, the folder and the root)")

        // The kernel's references stay counted while the node is away, and forget finds them.
        let f5 = try d.ino("dir/f5")
        let held = try #require(d.fs.lookupCount(f5))
        for p in paths where p != "dir/f5" { _ = try d.ino(p) }  // others push it out
        d.fs.forget(f5, 1)
        #expect(d.fs.lookupCount(f5) == held - 1)
        d.fs.forget(f5, held - 1)
        #expect(d.fs.lookupCount(f5) == 0)

        // Gone is gone: an unlinked file is not read in again.
        try d.fs.unlink(try d.ino("dir"), n("f9"))
        #expect(throws: FSError.notFound) { try d.ino("dir/f9") }

        // A restart reads folders whole and files only when asked for.
        d.fs.waitForRecycling()
        try d.open()
        #expect(d.fs.inodeCount == 63)
        let afterRestart = try paths.filter { $0 != "dir/f9" }.map { try look(d, $0) }
        #expect(afterRestart == before.enumerated().filter { paths[$0.offset] != "dir/f9" }.map(\.element))
    }

    /// The nodes that leave memory are the least recently reached: files reached between the
    /// writes of many others stay, whatever their number.
    @Test func theLeastRecentlySeenLeaveFirst() throws {
        let d = try Device(store: try newStore(), residentNodes: 20)
        try d.mkdir("dir")
        try d.fs.syncState()
        var kept: [UInt64] = []
        for i in 0 ..< 5 {
            try d.write("dir/kept\(i)", "kept \(i)")
            kept.append(try d.ino("dir/kept\(i)"))
        }
        try d.fs.syncState()
        for i in 0 ..< 200 {
            try d.write("dir/f\(i)", "content \(i)")
            if i % 3 == 0 { for k in kept { _ = try d.fs.getattr(k) } }
            if i % 20 == 19 { try d.fs.syncState() }
        }
        try d.fs.syncState()
        let resident = d.fs.residentNodes
        #expect(resident.evicted > 100, "nodes in memory: \(resident)")
        let stayed = d.fs.inodes.locked { t in kept.filter { t.resident($0) != nil } }
        #expect(stayed == kept, "of the files reached all along, these stayed: \(stayed) of \(kept)")
    }

    /// Writing over a placeholder (open with O_TRUNC: no download) and over a file downloaded
    /// first, with no node kept past those that must be: each step's change reaches the rows
    /// before the node may leave (a placeholder marked present only in memory came back a
    /// placeholder, the new bytes unseen).
    @Test func writingOverPlaceholdersKeepsEveryStep() throws {
        let store = try newStore()
        let a = try Device(store: store)
        let b = try Device(store: store, residentNodes: 0)
        for i in 0 ..< 4 { try a.write("f\(i)", "from a \(i)") }
        a.sync()
        b.pull()
        try b.write("f0", "b over a placeholder")
        _ = try b.fs.setattr(try b.ino("f1"), AttributeChanges(size: 3), caller: .root)
        _ = try b.read("f2")
        try b.write("f2", "b over a downloaded file")
        #expect(try b.read("f0") == "b over a placeholder")
        #expect(try b.read("f1") == "fro")
        #expect(try b.read("f2") == "b over a downloaded file")
        #expect(b.fs.nodeCheckFailures.withLock { $0 } == 0)
        b.sync()
        a.pull()
        #expect(try a.read("f0") == "b over a placeholder" && a.read("f1") == "fro" && a.read("f3") == "from a 3")
    }

    /// A file opened, written or just created stays in memory until its changes are rows.
    @Test func whatIsOnlyInMemoryStays() throws {
        let d = try Device(store: try newStore(), residentNodes: 0)
        let (a, fh) = try d.fs.create(rootIno, n("open"), mode: 0o644, flags: O_CREAT | O_WRONLY, caller: .root)
        let bytes = Array("written, not closed".utf8)
        _ = try bytes.withUnsafeBytes { try d.fs.write(fh, offset: 0, count: $0.count, from: $0.baseAddress!) }
        for i in 0 ..< 20 { try d.write("other\(i)", "x") }
        #expect(try d.fs.getattr(a.ino).size == Int64(bytes.count))
        try d.fs.flush(fh)
        d.fs.release(fh)
        for i in 0 ..< 20 { _ = try d.read("other\(i)") }  // reads mark access times: written as nodes leave
        #expect(try d.read("open") == "written, not closed")
        #expect(d.fs.nodeCheckFailures.withLock { $0 } == 0)
        #expect(d.fs.residentNodes.evicted > 0)
        // The local bytes the cache limit counts are every present file's, in memory or not.
        let counted = try d.fs.presentBytesBothWays
        #expect(counted.kept == counted.walked && counted.kept == Int64(bytes.count + 20))
    }
}
