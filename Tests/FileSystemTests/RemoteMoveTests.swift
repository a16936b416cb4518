import Foundation
import Synchronization
import Testing
import TestSupport
import UbiqClock
@testable import UbiqFS
import UbiqState
import UbiqStore
@testable import UbiqSync

/// A move made on another device arrives as a move (docs/sync.md): the item keeps its inode,
/// its downloaded bytes, its pin and its readers, and nothing is downloaded again.
@Suite struct RemoteMoveTests {
    func text(_ i: Int) -> String { "file \(i): " + String(repeating: "\(i % 10)", count: 20_000 + i) }

    @Test func aFileMovedElsewhereStaysDownloadedHere() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.mkdir("docs")
        try a.write("docs/report.txt", text(1))
        a.sync()
        let counting = CountingStore(store)
        let b = try Device(store: store, remote: counting)
        #expect(try b.read("docs/report.txt") == text(1))
        let ino = try b.ino("docs/report.txt")
        let fetched = counting.bytesRead
        // A reader that has it open keeps reading it through the move.
        let fh = try b.fs.open(ino, flags: O_RDONLY)
        defer { b.fs.release(fh) }

        try a.mkdir("archive")
        try a.fs.rename(try a.ino("docs"), n("report.txt"), try a.ino("archive"), n("2024.txt"))
        a.sync()
        b.pull()
        #expect(try b.names("docs") == [])
        #expect(try b.names("archive") == ["2024.txt"])
        #expect(try b.ino("archive/2024.txt") == ino)
        #expect(try b.fs.getattr(ino).blocks * 512 >= Int64(text(1).utf8.count))
        #expect(try b.read("archive/2024.txt") == text(1))
        var buf = [UInt8](repeating: 0, count: 16)
        let k = try buf.withUnsafeMutableBytes { try b.fs.read(fh, offset: 0, count: 16, into: $0.baseAddress!) }
        #expect(String(decoding: buf[..<k], as: UTF8.self) == String(text(1).prefix(16)))
        #expect(counting.bytesRead == fetched)
        // B records the new key: nothing of it goes up from here, and the store has one copy.
        #expect(try b.state.read { try $0.entries(of: ino).first?.remoteKey } == "archive/2024.txt")
        #expect(b.uploader.processRound(ignoringDelay: true) == 0)
        #expect(try runBlocking { try await store.list(prefix: "") }.map(\.key).sorted() == ["archive/", "archive/2024.txt", "docs/"])
    }

    /// A move goes to the store as copies and the deletes of what they copied, each said to be
    /// a move's (`CloudStore.deleteMoved`): a store with a log (S3) makes those with the move's
    /// log entry, so that other devices read the old keys until they learn of the move.
    @Test func aMoveGoesToTheStoreAsAMove() throws {
        let store = try newStore()
        let told = DeleteRecorder(store)
        let a = try Device(store: store, remote: told)
        try a.mkdir("docs")
        try a.mkdir("docs/sub")
        try a.write("docs/x", "x")
        try a.write("docs/sub/y", "y")
        try a.write("gone", "z")
        a.sync()
        try a.fs.rename(rootIno, n("docs"), rootIno, n("moved"))
        try a.fs.unlink(rootIno, n("gone"))
        a.sync()
        let deletes = told.deletes.sorted { $0.key < $1.key }
        #expect(deletes.map(\.key) == ["docs/", "docs/sub/", "docs/sub/y", "docs/x", "gone"])
        for d in deletes {
            #expect(d.movedTo == (d.key == "gone" ? nil : "moved/" + d.key.dropFirst(5)), "\(d)")
        }
    }

    /// Reads `count` bytes at `offset` of open file `fh`, as text.
    func readText(_ d: Device, _ fh: UInt64, at offset: Int64, _ count: Int) throws -> String {
        var buf = [UInt8](repeating: 0, count: count)
        let k = try buf.withUnsafeMutableBytes { try d.fs.read(fh, offset: offset, count: count, into: $0.baseAddress!) }
        return String(decoding: buf[..<k], as: UTF8.self)
    }

    /// A file of 10 MB (ten download chunks: more than a read and its readahead fetch) in
    /// `docs/`, written on A, and B on the same store, which fetches only what is read and
    /// what follows it, as a bucket without versions (a version moved away or written over
    /// cannot be read).
    func bigFileOnTwoDevices() throws -> (a: Device, b: Device, big: String) {
        let store = try newStore()
        let a = try Device(store: store)
        try a.mkdir("docs")
        let big = (0 ..< 1_000_000).map { String(format: "%09d\n", $0) }.joined()
        try a.write("docs/big", big)
        a.sync()
        let b = try Device(store: store, remote: Unversioned(store), completeInBackground: false)
        return (a, b, big)
    }

    /// `bigFileOnTwoDevices`, then `docs/` renamed on A, and B's feed following the store
    /// (its poll comes when asked, or at its interval); `stop` stops it.
    func movedWhileBFollows() throws -> (b: Device, ino: UInt64, big: String, stop: () -> Void) {
        let (a, b, big) = try bigFileOnTwoDevices()
        let ino = try b.ino("docs/big")
        try a.fs.rename(rootIno, n("docs"), rootIno, n("moved"))
        a.sync()
        b.feed.start()
        return (b, ino, big, { b.feed.stop() })
    }

    /// A file being downloaded here, moved elsewhere: its download goes on from the new key, and
    /// its progress is saved as of it. Before, it went on reading the old key, gone from a
    /// bucket without versions, and every read of a part not yet here failed (EIO) until the
    /// file was closed.
    @Test func aDownloadUnderWayFollowsAMoveElsewhere() throws {
        let (a, b, big) = try bigFileOnTwoDevices()
        let ino = try b.ino("docs/big")
        let fh = try b.fs.open(ino, flags: O_RDONLY)
        defer { b.fs.release(fh) }
        #expect(try readText(b, fh, at: 0, 20) == String(big.prefix(20)))
        #expect(b.materializer.source(ino)?.key == "docs/big")
        try a.fs.rename(rootIno, n("docs"), rootIno, n("moved"))
        a.sync()
        b.pull()
        #expect(try b.ino("moved/big") == ino)
        let now = try #require(b.materializer.source(ino))
        #expect(now.key == "moved/big")
        // What is here is saved as of the new version (a restart resumes from it).
        b.materializer.saver.sync {}
        #expect(try b.state.read { try $0.download(ino) }?.version == now.version)
        let at = 9_500_000
        #expect(try readText(b, fh, at: Int64(at), 20) == String(big.dropFirst(at).prefix(20)))
        #expect(try b.read("moved/big").utf8.count == 1 << 20)
    }

    /// A read that finds the version it reads gone from the store (another device's move
    /// deleted the old key, and this device has not yet read the log that tells of it) waits
    /// for the move to arrive, then reads the file where it went. Before, it failed (EIO).
    @Test func aReadWhoseVersionAMoveTookWaitsForTheMove() throws {
        let (a, b, big) = try bigFileOnTwoDevices()
        let ino = try b.ino("docs/big")
        let fh = try b.fs.open(ino, flags: O_RDONLY)
        defer { b.fs.release(fh) }
        try a.fs.rename(rootIno, n("docs"), rootIno, n("moved"))
        a.sync()
        // B's feed: its poll comes when the read asks (or at its interval).
        b.feed.start()
        defer { b.feed.stop() }
        #expect(try readText(b, fh, at: 1_500_000, 20) == String(big.dropFirst(1_500_000).prefix(20)))
        #expect(try b.ino("moved/big") == ino)
    }

    /// A placeholder opened to write is downloaded whole first: one whose version a move
    /// elsewhere took waits for the move, as a read does, and then opens and writes.
    @Test func anOpenToWriteWhoseVersionAMoveTookWaitsForTheMove() throws {
        let (b, ino, big, stop) = try movedWhileBFollows()
        defer { stop() }
        let fh = try b.fs.open(ino, flags: O_WRONLY)
        _ = try Array("new".utf8).withUnsafeBytes { try b.fs.write(fh, offset: 0, count: 3, from: $0.baseAddress!) }
        try b.fs.flush(fh)
        b.fs.release(fh)
        #expect(try b.ino("moved/big") == ino)
        let rfh = try b.fs.open(ino, flags: O_RDONLY)
        defer { b.fs.release(rfh) }
        #expect(try readText(b, rfh, at: 0, 20) == "new" + big.dropFirst(3).prefix(17))
    }

    /// So does a placeholder cut to a length other than 0 (downloaded whole first).
    @Test func aTruncateWhoseVersionAMoveTookWaitsForTheMove() throws {
        let (b, ino, big, stop) = try movedWhileBFollows()
        defer { stop() }
        #expect(try b.fs.setattr(ino, AttributeChanges(size: 25), caller: .root).size == 25)
        #expect(try b.ino("moved/big") == ino)
        #expect(try b.read("moved/big") == String(big.prefix(25)))
    }

    /// A read whose version is gone for good (written over on another device, in a bucket
    /// without versions, while it is open here) fails as soon as this device learns of the new
    /// version, and says so, rather than wait for a move that will not come.
    @Test func aReadWhoseVersionWasWrittenOverFailsWithoutWaiting() throws {
        let (a, b, _) = try bigFileOnTwoDevices()
        let fh = try b.fs.open(try b.ino("docs/big"), flags: O_RDONLY)
        defer { b.fs.release(fh) }
        try a.write("docs/big", "new")
        a.sync()
        b.feed.start()
        defer { b.feed.stop() }
        do {
            let got = try readText(b, fh, at: 0, 20)
            Issue.record("a version written over was read: \(got)")
        } catch let e as FSError {
            #expect("\(e)".contains("written over in the store while open here"), "\(e)")
        }
    }

    /// A folder of many files, pinned here, renamed elsewhere: the folder is the same item
    /// here, still pinned, every file still downloaded, no byte read again; what arrives in it
    /// later is downloaded (the pin followed).
    @Test func aPinnedFolderMovedElsewhereKeepsItsPinAndBytes() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.mkdir("photos")
        try a.mkdir("photos/2024")
        var paths: [String] = []
        for i in 0 ..< 30 {
            let p = i % 2 == 0 ? "photos/p\(i).jpg" : "photos/2024/p\(i).jpg"
            try a.write(p, text(i))
            paths.append(p)
        }
        a.sync()
        let counting = CountingStore(store)
        let b = try Device(store: store, remote: counting)
        let folder = try b.ino("photos")
        try b.fs.setPinned(folder, true)
        let inos = try paths.map { try b.ino($0) }
        try waitUntil(seconds: 20, every: 0.02) { try inos.allSatisfy { try b.fs.getattr($0).blocks > 0 } }
        let fetched = counting.bytesRead

        try a.fs.rename(rootIno, n("photos"), rootIno, n("pictures"))
        a.sync()
        b.pull()
        #expect(try b.names("") == ["pictures"])
        #expect(try b.ino("pictures") == folder)
        #expect(try b.fs.isPinned(folder))
        for (p, ino) in zip(paths, inos) {
            let moved = "pictures" + p.dropFirst("photos".count)
            #expect(try b.ino(moved) == ino)
            #expect(try b.fs.getattr(ino).blocks > 0)
            #expect(try b.state.read { try $0.entries(of: ino).first?.remoteKey } == moved)
        }
        #expect(counting.bytesRead == fetched)
        #expect(b.uploader.processRound(ignoringDelay: true) == 0)

        try a.write("pictures/2024/new.jpg", text(99))
        a.sync()
        b.pull()
        let new = try b.ino("pictures/2024/new.jpg")
        try waitUntil(seconds: 20, every: 0.02) { try b.fs.getattr(new).blocks > 0 }
    }

    /// A folder moved on another device while this one was stopped: at its next start, the
    /// store's listing (its feed's first poll) finds the new keys before the feed tells of the
    /// old ones' deletes, and pairs each with the item it moved from (a HEAD of the old key):
    /// the files keep their items and bytes, nothing is downloaded again. (Before 2026-11-30
    /// the listing came before the mount, wrote the new keys in as new placeholders, and the
    /// feed's deletes then removed the downloaded files.)
    @Test func aFolderMovedWhileTheDeviceWasStoppedIsAMoveAtItsNextStart() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.mkdir("photos")
        for i in 0 ..< 10 { try a.write("photos/p\(i).jpg", text(i)) }
        a.sync()
        let counting = CountingStore(store)
        let b = try Device(store: store, remote: counting)
        let inos = try (0 ..< 10).map { try b.ino("photos/p\($0).jpg") }
        for i in 0 ..< 10 { #expect(try b.read("photos/p\(i).jpg") == text(i)) }
        try waitUntil(seconds: 20, every: 0.02) { try inos.allSatisfy { try b.fs.getattr($0).blocks > 0 } }
        let fetched = counting.bytesRead
        try a.fs.rename(rootIno, n("photos"), rootIno, n("pictures"))
        a.sync()
        try b.open()
        #expect(try b.names("") == ["photos"])
        b.pull()
        #expect(try b.names("") == ["pictures"])
        for (i, ino) in inos.enumerated() {
            #expect(try b.ino("pictures/p\(i).jpg") == ino)
            #expect(try b.fs.getattr(ino).blocks > 0)
            #expect(try b.read("pictures/p\(i).jpg") == text(i))
        }
        #expect(counting.bytesRead == fetched)
        #expect(b.uploader.processRound(ignoringDelay: true) == 0)
    }

    /// Files with the same bytes (many are: empty-ish files, copies): each keeps its own item
    /// through its folder's move, by its name, and the folder moves whole.
    @Test func filesWithTheSameBytesKeepTheirOwnItems() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.mkdir("same")
        for i in 0 ..< 20 { try a.write("same/f\(i)", "the same bytes") }
        a.sync()
        let b = try Device(store: store)
        let folder = try b.ino("same")
        let inos = try (0 ..< 20).map { try b.ino("same/f\($0)") }
        try a.fs.rename(rootIno, n("same"), rootIno, n("moved"))
        a.sync()
        b.pull()
        #expect(try b.ino("moved") == folder)
        #expect(try (0 ..< 20).map { try b.ino("moved/f\($0)") } == inos)
    }

    /// Objects another tool wrote (no digest, no folder marker: a folder only by its files'
    /// keys), all with the same bytes, moved by a ubiq device: still moves.
    @Test func anotherToolsObjectsMoveToo() throws {
        let store = try newStore()
        let src = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-src-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: src) }
        try Data(repeating: 0x72, count: 64).write(to: src)
        for i in 0 ..< 10 {
            _ = try runBlocking { try await store.put("folder/f\(i)", contentsOf: src, metadata: ObjectMetadata(kind: .file), condition: .ifAbsent) }
        }
        let a = try Device(store: store)
        let b = try Device(store: store)
        let inos = try (0 ..< 10).map { try b.ino("folder/f\($0)") }
        for i in 0 ..< 10 { _ = try b.read("folder/f\(i)") }
        try a.fs.rename(rootIno, n("folder"), rootIno, n("renamed"))
        a.sync()
        b.pull()
        #expect(try (0 ..< 10).map { try b.ino("renamed/f\($0)") } == inos, "\(b.log.all.suffix(30))")
        // The old folder had no marker in the store: it went from there with its last file, and
        // goes here too (not left behind empty).
        #expect(try b.names("") == ["renamed"])
        #expect(try a.names("") == ["renamed"])
    }

    /// A folder another tool made (no marker: a folder only by its files' keys). Emptied by an
    /// `rm` of its files on one device, it stays there, and its marker goes up, so it stays on
    /// the others too. Emptied in the store by another tool, it goes. One changed here stays.
    @Test func aFolderWithoutAMarkerGoesOnlyWhereItWent() throws {
        let store = try newStore()
        let src = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-src-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: src) }
        try Data("x".utf8).write(to: src)
        for key in ["docs/a", "docs/b", "tmp/deep/c", "kept/d"] {
            _ = try runBlocking { try await store.put(key, contentsOf: src, metadata: ObjectMetadata(kind: .file), condition: .ifAbsent) }
        }
        let a = try Device(store: store)
        let b = try Device(store: store)
        #expect(try b.names("") == ["docs", "kept", "tmp"])

        // rm of every file in docs on A: docs stays on A, and on B.
        let docs = try a.ino("docs")
        try a.fs.unlink(docs, n("a"))
        try a.fs.unlink(docs, n("b"))
        a.sync()
        #expect(try runBlocking { try await store.head("docs/") }.key == "docs/")
        b.pull()
        #expect(try b.names("docs") == [])
        #expect(try a.names("docs") == [])

        // Another tool deletes what tmp held: tmp/deep, then tmp, go from B. kept/ was chmod-ed
        // on B (on its way up as a folder): it stays.
        _ = try b.fs.setattr(try b.ino("kept"), AttributeChanges(mode: 0o700), caller: .root)
        for key in ["tmp/deep/c", "kept/d"] { try runBlocking { try await store.delete(key, condition: .always) } }
        b.pull()
        #expect(try b.names("") == ["docs", "kept"], "\(b.log.all.suffix(10))")
        #expect(try b.names("kept") == [])
    }

    /// A folder's move seen over two polls (a large folder: the mover's log objects come one
    /// after another): the first poll brings the folder's new key and a few files, the next the
    /// rest. Every file keeps its bytes; the old folder waits for what it holds to go, then goes
    /// (it is not uploaded again); both devices end with the same tree.
    @Test func aFolderMoveSeenOverTwoPollsMovesEveryFile() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.mkdir("photos")
        try a.mkdir("photos/2024")
        var paths: [String] = []
        for i in 0 ..< 12 {
            let p = i % 3 == 0 ? "photos/2024/p\(i).jpg" : "photos/p\(i).jpg"
            try a.write(p, text(i))
            paths.append(p)
        }
        a.sync()
        let cutting = ShapedFeed(CountingStore(store))
        let b = try Device(store: store, remote: cutting)
        for p in paths { _ = try b.read(p) }
        let inos = try paths.map { try b.ino($0) }
        let fetched = cutting.counting.bytesRead

        try a.fs.rename(rootIno, n("photos"), rootIno, n("pictures"))
        a.sync()
        cutting.cut = true
        b.feed.batchSize = 6
        b.pull()
        #expect(try b.names("").contains("pictures"))
        cutting.cut = false
        b.feed.batchSize = 1000
        b.pull()
        #expect(try b.names("") == ["pictures"])
        for (p, ino) in zip(paths, inos) {
            let moved = "pictures" + p.dropFirst("photos".count)
            #expect(try b.ino(moved) == ino)
            #expect(try b.fs.getattr(ino).blocks > 0)
        }
        #expect(cutting.counting.bytesRead == fetched)
        b.sync()
        a.pull()
        #expect(try a.names("") == ["pictures"])
        #expect(try runBlocking { try await store.list(prefix: "") }.filter { $0.key.hasPrefix("photos") }.isEmpty)
    }

    /// A folder deleted elsewhere by a device that did not know all it held: what this device
    /// put in it went up, and stays in the store. The folder waits a few polls for it to go (as
    /// in a move), then stays, and goes up again: both devices end with it and the file.
    @Test func aFolderDeletedElsewhereThatStillHoldsAStoreFileStays() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.mkdir("dir")
        try a.write("dir/old", "old")
        a.sync()
        let b = try Device(store: store)
        try b.write("dir/new", "made on B")
        b.sync()
        try a.fs.unlink(try a.ino("dir"), n("old"))
        try a.fs.rmdir(rootIno, n("dir"))
        a.sync()
        for _ in 0 ... RemoteApplier.emptyingTries { b.pull() }
        #expect(try b.names("dir") == ["new"])
        b.sync()
        #expect(try runBlocking { try await store.head("dir/") }.key == "dir/")
        a.pull()
        #expect(try a.read("dir/new") == "made on B")
    }

    /// The store copies, then deletes; a feed may tell the copy a poll before the delete (a log
    /// object written between the two). The old key is asked for, and the move arrives whole:
    /// a file with bytes, and an empty one (found by its id in the store alone).
    @Test func aMoveWhoseDeleteTheFeedHasNotToldIsStillAMove() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.write("f", text(3))
        try a.write("e", "")
        a.sync()
        let hiding = ShapedFeed(CountingStore(store))
        let b = try Device(store: store, remote: hiding)
        #expect(try b.read("f") == text(3))
        let ino = try b.ino("f")
        let empty = try b.ino("e")
        let fetched = hiding.counting.bytesRead
        hiding.hideDeletes = true
        try a.fs.rename(rootIno, n("f"), rootIno, n("g"))
        try a.fs.rename(rootIno, n("e"), rootIno, n("e2"))
        a.sync()
        b.pull()
        #expect(try b.names("") == ["e2", "g"])
        #expect(try b.ino("e2") == empty)
        #expect(try b.ino("g") == ino)
        #expect(try b.fs.getattr(ino).blocks > 0)
        #expect(hiding.counting.bytesRead == fetched)
    }

    /// A move whose new key the store fails to tell of for a poll (its HEAD fails three times):
    /// the old key's delete waits for it, and the next poll applies both as a move. Before, the
    /// delete removed the file here, and the new key came next poll as a new item: another
    /// inode, its bytes to download again.
    @Test func aMoveWhoseNewKeyCannotBeReadForAPollIsStillAMove() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.mkdir("docs")
        try a.write("docs/f", text(4))
        a.sync()
        let shaped = ShapedFeed(CountingStore(store))
        let b = try Device(store: store, remote: shaped)
        #expect(try b.read("docs/f") == text(4))
        let ino = try b.ino("docs/f")
        let fetched = shaped.counting.bytesRead
        try a.mkdir("archive")
        try a.fs.rename(try a.ino("docs"), n("f"), try a.ino("archive"), n("f"))
        a.sync()
        shaped.failHeads(of: "archive/f", times: 3)
        b.pull()
        #expect(try b.names("docs") == ["f"], "the delete waits for the key the file may have gone to")
        b.pull()
        #expect(try b.names("docs") == [])
        #expect(try b.ino("archive/f") == ino)
        #expect(try b.fs.getattr(ino).blocks > 0)
        #expect(try b.read("archive/f") == text(4))
        #expect(shaped.counting.bytesRead == fetched)
    }

    /// Not moves: a copy made elsewhere (the old key stays), and a file deleted while another
    /// with other bytes comes; a file changed here before the move arrives keeps its edit.
    /// Every upload carries the item's id in the store (`ObjectMetadata.fileID`), the same
    /// through renames and edits on any device, new for a new item or a new hard link.
    @Test func anItemKeepsItsIDThroughRenamesAndEditsOnEveryDevice() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.write("f", "one")
        a.sync()
        func id(_ key: String) throws -> String? { try runBlocking { try await store.head(key) }.metadata.fileID }
        let first = try #require(try id("f"))
        #expect(ObjectMetadata.isFileID(first))
        #expect(try a.state.read { try $0.entries(remoteKey: "f").first?.remoteFileID } == first)
        try a.fs.rename(rootIno, n("f"), rootIno, n("g"))
        try a.write("g", "two")
        a.sync()
        #expect(try id("g") == first)
        let b = try Device(store: store)
        _ = try b.fs.setattr(try b.ino("g"), AttributeChanges(mode: 0o600), caller: .root)
        _ = try b.fs.link(try b.ino("g"), rootIno, n("hard"))
        b.sync()
        #expect(try id("g") == first)
        let other = try #require(try id("hard"))
        #expect(other != first)
        try a.write("new", "three")
        a.sync()
        #expect(try id("new") != first && id("new") != other)
    }

    /// An empty file and a symbolic link have no bytes to know them by: moved elsewhere, they
    /// are the same items here by their id (before ids, each arrived as a new item).
    @Test func emptyFilesAndLinksMovedElsewhereAreMovesByTheirID() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.mkdir("docs")
        try a.write("docs/empty", "")
        _ = try a.fs.symlink(n("../elsewhere"), try a.ino("docs"), n("link"), caller: .root)
        a.sync()
        let b = try Device(store: store)
        let (empty, link) = (try b.ino("docs/empty"), try b.ino("docs/link"))
        try a.mkdir("archive")
        try a.fs.rename(try a.ino("docs"), n("empty"), try a.ino("archive"), n("empty.txt"))
        try a.fs.rename(try a.ino("docs"), n("link"), try a.ino("archive"), n("link2"))
        a.sync()
        b.pull()
        #expect(try b.names("docs") == [])
        #expect(try b.ino("archive/empty.txt") == empty)
        #expect(try b.ino("archive/link2") == link)
        #expect(try b.fs.readlink(link) == n("../elsewhere"))
        #expect(b.log.count("moved to archive/") == 2, "\(b.log.all)")
    }

    /// A file renamed and edited before its upload is one item elsewhere too: it keeps its inode
    /// (an open reader keeps reading it) and takes the new bytes.
    @Test func aFileMovedAndEditedElsewhereIsTheSameItem() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.write("draft.txt", text(1))
        a.sync()
        let b = try Device(store: store)
        #expect(try b.read("draft.txt") == text(1))
        let ino = try b.ino("draft.txt")
        try a.fs.rename(rootIno, n("draft.txt"), rootIno, n("final.txt"))
        try a.write("final.txt", text(2))
        a.sync()
        b.pull()
        #expect(try b.names("") == ["final.txt"])
        #expect(try b.ino("final.txt") == ino)
        #expect(try b.read("final.txt") == text(2))
    }

    @Test func copiesAndLookalikesAreNotMoves() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.write("original", text(4))
        try a.write("doomed", text(5))
        try a.write("edited", text(6))
        a.sync()
        let b = try Device(store: store)
        for p in ["original", "doomed", "edited"] { _ = try b.read(p) }
        let (original, doomed, edited) = (try b.ino("original"), try b.ino("doomed"), try b.ino("edited"))

        // A copy: the same bytes under a new key, the old one kept.
        _ = try runBlocking { try await store.copy(from: "original", version: try await store.head("original").version,
                                                   to: "copy", metadata: nil, condition: .ifAbsent) }
        try a.fs.unlink(rootIno, n("doomed"))
        try a.write("newcomer", text(7))
        try a.fs.rename(rootIno, n("edited"), rootIno, n("renamed"))
        a.sync()
        try b.write("edited", text(6) + " and more, here")
        b.pull()
        #expect(try b.names("") == ["copy", "edited", "newcomer", "original", "renamed"])
        #expect(try b.ino("original") == original)
        #expect(try b.fs.getattr(original).blocks > 0)
        #expect(try b.ino("copy") != original)
        #expect(try b.read("copy") == text(4))
        #expect(try b.ino("newcomer") != doomed)
        #expect(try b.read("newcomer") == text(7))
        // The edit beats the move as it beats a delete: kept here under its name, and uploaded.
        #expect(try b.ino("edited") == edited)
        #expect(try b.read("edited") == text(6) + " and more, here")
        #expect(try b.read("renamed") == text(6))
    }

    @Test func foldersThatMovedWithAFile() {
        func pairs(_ old: String, _ new: String) -> [String] {
            RemoteMoveTests.foldersMoved(old, new)
        }
        #expect(pairs("A/sub/f", "B/sub/f") == ["B/sub/ <- A/sub/", "B/ <- A/"])
        #expect(pairs("A/f", "B/g") == [])
        #expect(pairs("A/f", "A/B/f") == ["A/B/ <- A/"])
        #expect(pairs("x/A/f", "x/B/f") == ["x/B/ <- x/A/"])
        #expect(pairs("f", "B/f") == [])
        #expect(pairs("A/f", "f") == [])
        // NFC and NFD spellings are two names: x/ did not move with café.
        #expect(pairs("x/caf\u{E9}/f", "y/cafe\u{301}/f").count == 1)
        #expect(pairs("x/caf\u{E9}/f", "y/caf\u{E9}/f").count == 2)
    }

    static func foldersMoved(_ old: String, _ new: String) -> [String] {
        RemoteMoves.foldersMoved(from: old, to: new).map { "\($0.new.key) <- \($0.old.key)" }
    }
}

/// A store whose feed is less than whole: while `hideDeletes` is set it leaves deletes out (a
/// feed that tells a copy a poll before its delete), while `cut` is set it says no more after
/// the first batch (the rest comes at the next poll); `failHeads` makes a key unreadable.
final class ShapedFeed: ForwardingStore, @unchecked Sendable {
    let counting: CountingStore
    var hideDeletes = false
    var cut = false
    private let lock = NSLock()
    private var failing: [String: Int] = [:]
    init(_ counting: CountingStore) { self.counting = counting; super.init(counting) }
    /// The next `times` HEADs of `key` fail as a store that cannot be reached.
    func failHeads(of key: String, times: Int) { lock.withLock { failing[key] = times } }
    override func head(_ key: String) async throws -> ObjectInfo {
        let fail = lock.withLock { () -> Bool in
            guard let n = failing[key], n > 0 else { return false }
            failing[key] = n - 1
            return true
        }
        if fail { throw StoreError.unavailable("test: \(key) cannot be read now") }
        return try await super.head(key)
    }
    override func changes(since cursor: String?, limit: Int) async throws -> ChangeBatch {
        var batch = try await counting.changes(since: cursor, limit: limit)
        if cut { batch.more = false }
        if hideDeletes { batch.changes.removeAll { $0.kind == .delete } }
        return batch
    }
}

/// A store that says which deletes it was asked for, and where each moved its key to, if it
/// was a move's.
final class DeleteRecorder: ForwardingStore, @unchecked Sendable {
    private let lock = NSLock()
    private var asked: [(key: String, movedTo: String?)] = []
    var deletes: [(key: String, movedTo: String?)] { lock.withLock { asked } }
    override func delete(_ key: String, condition: WriteCondition) async throws {
        lock.withLock { asked.append((key, nil)) }
        try await super.delete(key, condition: condition)
    }
    override func deleteMoved(_ key: String, version: String, to destination: String) async throws {
        lock.withLock { asked.append((key, destination)) }
        try await super.deleteMoved(key, version: version, to: destination)
    }
}

/// The embedded store as a bucket without versions is: a version deleted or written over
/// cannot be read.
final class Unversioned: ForwardingStore, @unchecked Sendable {
    override func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        guard try await inner.head(key).version == version else { throw StoreError.notFound(key: key) }
        return try await super.read(key, version: version, range: range)
    }
}

/// A read waits for a move by the state's clock.
@Suite struct MoveWaitTests {
    /// A read whose version is gone from the store (and whose move never comes) looks after each
    /// poll, and fails, saying why, once the clock has passed its wait: the wait goes by the
    /// clock, not by the wall (before, a quarter-second timer of its own polled the state).
    @Test func aReadWaitsForAMoveByTheClockThenFails() throws {
        let store = try newStore()
        let a = try Device(store: store)
        try a.write("f", String(repeating: "x", count: 1 << 20))
        a.sync()
        let time = ManualTime()
        let faulty = FaultyStore(store)
        let b = try Device(store: store, remote: faulty, completeInBackground: false, time: time)
        faulty.hold(readsAt: 0)
        let fh = try b.fs.open(try b.ino("f"), flags: O_RDONLY)
        defer { b.fs.release(fh) }
        let result = Mutex<Result<Int, any Error>?>(nil)
        let reader = Thread {
            var buf = [UInt8](repeating: 0, count: 10)
            let r = Result { try buf.withUnsafeMutableBytes { try b.fs.read(fh, offset: 0, count: 10, into: $0.baseAddress!) } }
            result.withLock { $0 = r }
        }
        reader.start()
        #expect(waitUntil { faulty.faultsInjected["held"] ?? 0 > 0 }, "the read never reached the store")
        faulty.release(readsAt: 0, failing: .notFound(key: "f"))
        // It waits, looking after each poll: nothing has moved.
        for _ in 0 ..< 3 { b.pull() }
        #expect(result.withLock { $0 == nil ? "waiting" : "ended" } == "waiting", "the read did not wait for a move")
        time.advance(by: 31)
        #expect(waitUntil(seconds: 10) { result.withLock { $0 != nil } }, "the read still waits past the clock's deadline")
        let failure = try #require(result.withLock { $0 }.map { r -> String? in if case .failure(let e) = r { return "\(e)" } else { return nil } })
        #expect(failure?.contains("no move of it came in 30 s") == true, "\(String(describing: failure))")
    }
}
