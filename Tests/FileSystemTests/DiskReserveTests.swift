import Foundation
import Synchronization
import Testing
import TestSupport
@testable import UbiqState
@testable import UbiqStore
@testable import UbiqSync

/// The state database's reserve on a full disk (the free space is the test's to set).
@Suite struct DiskReserveTests {
    /// A disk whose free space the test sets.
    final class Disk: Sendable {
        let free = Mutex<Int64>(1 << 30)
        var probe: @Sendable (String) -> Int64? { { [self] _ in free.withLock { $0 } } }
    }

    private func reserve(_ disk: Disk) throws -> (DiskReserve, String) {
        let dir = TempPaths.make("ubiq-reserve")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let path = dir.appendingPathComponent("state.db.reserve").path
        let r = DiskReserve(path: path, bytes: 8 << 20, margin: 4 << 20, freeBytes: disk.probe)
        return (r, path)
    }

    @Test func heldItKeepsItsSpaceInAFileAndContentIsNotLimited() throws {
        let disk = Disk()
        let (r, path) = try reserve(disk)
        #expect(!r.isHeld)
        #expect(r.restore())
        var st = stat()
        #expect(stat(path, &st) == 0 && st.st_size == 8 << 20)
        disk.free.withLock { $0 = 0 }
        #expect(r.contentHasRoom(for: 1 << 20), "while held, the disk itself says no")
    }

    /// Given up for a commit, its space is the database's: content may not take it, and it is
    /// not taken back until there is room for it and a margin (else the next commit finds the
    /// disk full again with no reserve left: the EIO an rm once got).
    @Test func releasedItsSpaceIsNotForContentAndComesBackOnlyWithAMargin() throws {
        let disk = Disk()
        let (r, path) = try reserve(disk)
        #expect(r.restore())
        #expect(r.release())
        #expect(!r.isHeld && access(path, F_OK) != 0)
        #expect(!r.release(), "released once")
        // The released 8 MiB are free: 1 MiB more of content would eat into them.
        disk.free.withLock { $0 = 8 << 20 }
        #expect(!r.contentHasRoom(for: 1 << 20))
        #expect(!r.restore(), "taking it back would fill the disk again")
        #expect(access(path, F_OK) != 0)
        disk.free.withLock { $0 = 11 << 20 }
        #expect(r.contentHasRoom(for: 3 << 20))
        #expect(!r.contentHasRoom(for: (3 << 20) + 1))
        #expect(!r.restore(), "8 MiB and a 4 MiB margin are needed")
        disk.free.withLock { $0 = 12 << 20 }
        #expect(r.restore())
        #expect(r.isHeld && access(path, F_OK) == 0)
    }

    /// An upload's staging copy that finds no room leaves nothing behind and says ENOSPC (so
    /// the upload goes from the cache file itself).
    @Test func stagingWithoutRoomFailsWithENOSPCAndLeavesNoCopy() throws {
        let disk = Disk()
        let (r, _) = try reserve(disk)
        let dir = TempPaths.make("ubiq-stage")
        let cache = try ContentCache(directory: dir, reserve: r)
        let fd = try cache.createAndOpen(7)
        let data = Data(repeating: 1, count: 2 << 20)
        try LocalWriteError.write(data, to: fd, at: 0)
        close(fd)
        // Held: the copy goes.
        #expect(r.restore())
        let staged = try cache.stage(7, generation: 1)
        #expect(FileManager.default.contents(atPath: staged.path) == data)
        unlink(staged.path)
        // Released, 9 MiB free: a 2 MiB copy would take the database's space.
        #expect(r.release())
        disk.free.withLock { $0 = 9 << 20 }
        #expect(throws: LocalWriteError.self) { try cache.stage(7, generation: 2) }
        do { _ = try cache.stage(7, generation: 2) } catch let e as LocalWriteError { #expect(e.errno == ENOSPC) }
        #expect(try FileManager.default.contentsOfDirectory(atPath: cache.staging.path).isEmpty)
    }

    /// A staging copy a crash left behind is gone at the next start.
    @Test func stagingLeftoversAreClearedAtStart() throws {
        let dir = TempPaths.make("ubiq-stage")
        let cache = try ContentCache(directory: dir)
        FileManager.default.createFile(atPath: cache.staging.path + "/9-3", contents: Data(count: 100))
        ContentCache.clearStaging(in: dir)
        #expect(try FileManager.default.contentsOfDirectory(atPath: cache.staging.path).isEmpty)
    }
}
