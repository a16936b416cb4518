import Foundation
import Testing
import TestSupport
@testable import UbiqFS
import UbiqState
import UbiqStore
import UbiqSync

/// The cache files of deleted files are kept, emptied, for new files (the pool).
@Suite struct ContentCachePoolTests {
    func inode(_ path: String) -> ino_t? {
        var st = stat()
        return stat(path, &st) == 0 ? st.st_ino : nil
    }

    func size(_ fd: Int32) -> Int {
        var st = stat()
        return fstat(fd, &st) == 0 ? Int(st.st_size) : -1
    }

    @Test func aDeletedFilesCacheFileBecomesANewFilesEmpty() throws {
        let dir = TempPaths.make("ubiq-pool")
        let cache = try ContentCache(directory: dir)
        let fd = try cache.createAndOpen(1)
        try LocalWriteError.write(Data("secret bytes".utf8), to: fd, at: 0)
        close(fd)
        let disk = inode(cache.path(1))
        cache.recycle(1)
        #expect(inode(cache.path(1)) == nil)
        #expect(cache.pooled == 1)
        // The same disk file, and none of the old bytes.
        let fresh = try cache.createAndOpen(2)
        defer { close(fresh) }
        #expect(inode(cache.path(2)) == disk)
        #expect(size(fresh) == 0)
        #expect(cache.pooled == 0)
        // An empty pool: a new disk file.
        let other = try cache.createAndOpen(3)
        close(other)
        #expect(inode(cache.path(3)) != disk)
    }

    @Test func thePoolOutlivesTheRunAndStaysWithinItsLimit() throws {
        let dir = TempPaths.make("ubiq-pool")
        var cache = try ContentCache(directory: dir, poolLimit: 2)
        for ino: UInt64 in 1 ... 3 { close(try cache.createAndOpen(ino)) }
        for ino: UInt64 in 1 ... 3 { cache.recycle(ino) }
        // The third went away: the pool was full.
        #expect(cache.pooled == 2)
        #expect(try FileManager.default.contentsOfDirectory(atPath: cache.pool.path).count == 2)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { !$0.hasPrefix(".") }.isEmpty)
        cache = try ContentCache(directory: dir, poolLimit: 1)
        #expect(cache.pooled == 1)
        #expect(try FileManager.default.contentsOfDirectory(atPath: cache.pool.path).count == 1)
        let fd = try cache.createAndOpen(9)
        close(fd)
        #expect(cache.pooled == 0)
    }

    /// A download still writing into the cache file of a deleted file must never write into a
    /// new file's: such a file is deleted, not pooled.
    @Test func aFileADownloadHoldsIsNeverPooled() throws {
        let dir = TempPaths.make("ubiq-pool")
        let cache = try ContentCache(directory: dir)
        let held = cache.openHeld(4, flags: O_RDWR | O_CREAT)
        #expect(held >= 0)
        cache.recycle(4)
        #expect(cache.pooled == 0)
        #expect(inode(cache.path(4)) == nil)
        try LocalWriteError.write(Data("late chunk".utf8), to: held, at: 0)
        cache.closeHeld(4, held)
        let fresh = try cache.createAndOpen(5)
        defer { close(fresh) }
        #expect(size(fresh) == 0)
        // Once closed, a held file is pooled again as any other.
        let again = cache.openHeld(6, flags: O_RDWR | O_CREAT)
        cache.closeHeld(6, again)
        cache.recycle(6)
        #expect(cache.pooled == 1)
    }

    /// Through the file system: rm, then a new file gets the old disk file, empty, and reads
    /// back only its own bytes.
    @Test func aNewFileAfterAnRmReadsOnlyItsOwnBytes() throws {
        let d = try Device(store: try newStore())
        try d.write("old", "the old file's bytes, longer than the new")
        let ino = try d.ino("old")
        let disk = inode(d.fs.cache.path(ino))
        try d.fs.unlink(rootIno, n("old"))
        d.fs.forget(ino, d.fs.lookupCount(ino) ?? 0)
        d.fs.waitForRecycling()
        #expect(d.fs.cache.pooled == 1)
        try d.write("new", "new")
        let fresh = try d.ino("new")
        #expect(inode(d.fs.cache.path(fresh)) == disk)
        #expect(try d.read("new") == "new")
        #expect(try d.fs.getattr(fresh).size == 3)
    }
}

/// The content digest (SHA-256, from libcrypto) against FIPS 180-2's examples, over reads of a
/// file in pieces; a copy of a digest under way goes on on its own.
@Suite struct ContentDigestTests {
    @Test func knownAnswersInPiecesAndCopies() throws {
        let path = TempPaths.make("ubiq-digest").path
        let text = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        #expect(try ContentDigest.of(path: path) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        let fd = open(path, O_RDONLY)
        defer { close(fd) }
        var d = ContentDigest()
        #expect(d.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "no bytes")
        let first = d.add(fd, 0 ..< 3)
        #expect(first)
        let abc = d
        let rest = d.add(fd, 3 ..< Int64(text.utf8.count))
        #expect(rest)
        #expect(d.hex() == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        #expect(abc.hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "the copy saw only abc")
        let past = d.add(fd, 0 ..< 1000)
        #expect(!past, "past the end")
    }
}
