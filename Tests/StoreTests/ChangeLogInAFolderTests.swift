import Foundation
import Testing
import TestSupport
@testable import UbiqStore
@testable import UbiqS3

/// The change log's own logic (ChangeLog: batches, moves held back and logged whole, the
/// deletes a move waits with, reading, pruning) over log objects kept in a plain folder, so it
/// runs in milliseconds without a server; S3ChangeLogTests runs it again on SeaweedFS, through
/// the S3 store.
@Suite struct ChangeLogInAFolderTests {
    let meta = ObjectMetadata(kind: .file, mode: 0o644, uid: 1000, gid: 1000, mtimeNs: 1_700_000_000_000_000_000)

    func put(_ key: String, _ version: String, from: String? = nil, row: Int64? = nil) -> ChangeLog.Entry {
        .init(op: "put", key: key, version: version,
              wrote: ObjectInfo(key: key, version: version, size: 3, metadata: meta, contentTag: "\"t-\(version)\""),
              at: 1_800_000_000_000, row: row, from: from)
    }

    static let seal = BucketSeal(secret: "the devices' secret", bucket: "b", prefix: "drive/")

    func devices() -> (FolderLogObjects, ChangeLog, ChangeLog) {
        let folder = FolderLogObjects(TempPaths.make("ubiq-log"))
        let a = ChangeLog(objects: folder, reserved: S3Objects.reserved, device: "a", seal: Self.seal), b = ChangeLog(objects: folder, reserved: S3Objects.reserved, device: "b", seal: Self.seal)
        a.publishesBySelf = false
        b.publishesBySelf = false
        return (folder, a, b)
    }

    /// What one device notes reaches another in order, in one log object for a round; a look
    /// that finds nothing new costs one listing; the reader reads its own device's objects too.
    @Test func entriesOfOneDeviceAreReadByAnother() async throws {
        let (folder, a, b) = devices()
        let start = a.serverNow()
        a.record(put("docs/x", "v1"))
        a.record(.init(op: "delete", key: "docs/y", version: nil))
        a.record(put("docs/z", "v2"))
        try await a.publish()
        #expect(try folder.names().count == 1)
        let read = try await b.look(from: start, markOnly: false)
        #expect(read.changes.map(\.key) == ["docs/x", "docs/y", "docs/z"])
        #expect(read.changes.map(\.kind) == [.put, .delete, .put])
        #expect(read.changes[0].claimed?.size == 3 && read.changes[0].claimed?.contentTag == "\"t-v1\"")
        #expect(read.notes.allSatisfy { !$0.mine } && read.requests == 2, "a listing and a GET: \(read.requests)")
        b.noteRead(read)
        let again = try await b.look(from: read.position, markOnly: false)
        #expect(again.changes.isEmpty && again.requests == 1)
        let own = try await a.look(from: start, markOnly: false)
        #expect(own.changes.count == 3 && own.notes.allSatisfy(\.mine))
    }

    /// A folder's move (copies, then the deletes of their sources, which wait) is held while
    /// rounds follow one another, then goes whole, as one `move` entry; its deletes are made
    /// just before that log object, and never one the log does not then tell.
    @Test func aMoveIsHeldThenLoggedWholeAfterItsDeletes() async throws {
        let (folder, a, b) = devices()
        let start = a.serverNow()
        let made = Locked<[(keys: [String], logObjects: Int)]>([])
        a.settleDeletes = { keys, ahead in
            made.withLock { $0.append((keys + ahead, (try? folder.names().count) ?? -1)) }
            return ["old/f3"]  // refused: another device wrote it meanwhile
        }
        for i in 0 ..< 6 {
            a.record(put("new/f\(i)", "n\(i)", from: "old/f\(i)"))
            a.record(.init(op: "delete", key: "old/f\(i)", version: nil, deferred: true))
            if i % 2 == 1 {
                try await a.publish(holdingMoves: true)
                #expect(try folder.names().isEmpty, "a round of a move under way went to the log")
            }
        }
        #expect(made.withLock { $0.isEmpty }, "a delete was made before its move was logged")
        try await a.publish(holdingMoves: false)
        let names = try folder.names()
        #expect(names.count == 1)
        #expect(made.withLock { $0.count == 1 && $0[0].logObjects == 0 && Set($0[0].keys) == Set((0 ..< 6).map { "old/f\($0)" }) })
        let (opened, sealed) = Self.seal.opened(try folder.contents(names[0]), name: names[0])
        #expect(sealed)
        let body = String(decoding: opened, as: UTF8.self)
        let lines = body.split(separator: "\n")
        #expect(lines.count == 2 && lines.contains { $0.contains(#""op":"move""#) }, "\(body)")
        let read = try await b.look(from: start, markOnly: false)
        let deletes = read.changes.filter { $0.kind == .delete }.map(\.key).sorted()
        #expect(deletes == ["old/f0", "old/f1", "old/f2", "old/f4", "old/f5"], "\(read.changes)")
        #expect(read.changes.filter { $0.kind == .put }.count == 6)
    }

    /// A look lists from a window before the last one; objects older than the retention go at
    /// a prune, younger ones and what is not a log object's name stay.
    @Test func oldLogObjectsArePrunedAndOthersLeftAlone() async throws {
        let (folder, a, _) = devices()
        let now = a.serverNow()
        let old = ChangeLog.name(time: now - 3_600_000, device: "x")
        let young = ChangeLog.name(time: now - 60_000, device: "x")
        for name in [old, young, "not-a-log-object"] {
            try await folder.create(S3Objects.logFolder + name, Data(#"{"op":"put","key":"k"}"#.utf8))
        }
        try await a.prune(olderThan: 1800)
        #expect(try folder.names().sorted() == [young, "not-a-log-object"].sorted())
    }

    /// Lines that are not entries, keys that are not names or are the store's own, and an
    /// operation this version does not know are passed over, each said; the rest is read.
    @Test func whatALogObjectHoldsCannotHurtAReader() async throws {
        let (folder, _, b) = devices()
        let start = b.serverNow()
        let lines = [#"{"op":"put","key":"good","version":"v"}"#, "not json", #"{"op":"put","key":"../escape"}"#,
                     #"{"op":"put","key":".ubiquity/s3/log/x"}"#, #"{"op":"rename","key":"a"}"#, #"{"op":"delete","key":"gone"}"#]
        try await folder.create(S3Objects.logFolder + ChangeLog.name(time: start, device: "other"),
                                Data(lines.joined(separator: "\n").utf8))
        let read = try await b.look(from: start, markOnly: false)
        #expect(read.changes.map(\.key) == ["good", "gone"])
        #expect(read.unreadable.count == 4, "\(read.unreadable.lines)")
    }
}

extension ChangeLogInAFolderTests {
    /// An empty log object (its ranged GET is refused) and one that does not read hold back no
    /// other device's change: the look reads the rest and takes the empty one as read; the one
    /// that failed is read at a later look, and passed over, said once, after a few. (An empty
    /// object failed every look, and every device fell behind: 21 s for a change instead of 3.)
    @Test func anObjectThatDoesNotReadHoldsBackNoOther() async throws {
        let (folder, a, b) = devices()
        let start = b.serverNow()
        try await folder.create(S3Objects.logFolder + ChangeLog.name(time: start, device: "x"), Data())
        let stuck = ChangeLog.name(time: start + 1, device: "y")
        try await folder.create(S3Objects.logFolder + stuck, Data(#"{"op":"put","key":"late","version":"v"}"#.utf8))
        folder.failing.withLock { _ = $0.insert(S3Objects.logFolder + stuck) }
        a.record(put("docs/x", "v1"))
        try await a.publish()
        let first = try await b.look(from: start, markOnly: false)
        #expect(first.changes.map(\.key) == ["docs/x"], "\(first.changes)")
        #expect(first.unreadLeft == 1 && !first.whole)
        b.noteRead(first)
        // Read once it reads.
        folder.failing.withLock { $0.removeAll() }
        let second = try await b.look(from: first.position, markOnly: false)
        #expect(second.changes.map(\.key) == ["late"], "\(second.changes)")
        b.noteRead(second)
        // One that never reads is passed over at its third try, and said.
        let never = ChangeLog.name(time: start + 2, device: "z")
        try await folder.create(S3Objects.logFolder + never, Data(#"{"op":"put","key":"never","version":"v"}"#.utf8))
        folder.failing.withLock { _ = $0.insert(S3Objects.logFolder + never) }
        var said: [String] = []
        for _ in 0 ..< ChangeLog.attemptsPerObject {
            let look = try await b.look(from: second.position, markOnly: false)
            b.noteRead(look)
            said += look.unreadable.lines
        }
        #expect(said.count == 1 && said[0].contains(never), "\(said)")
        let after = try await b.look(from: second.position, markOnly: false)
        #expect(after.changes.isEmpty && after.unreadLeft == 0 && after.requests == 1, "\(after)")
    }

    /// Pruning passes over names that are not a log object's, however many sort before the
    /// log's own (a page of 1,000 of them stopped every prune), and deletes the old ones.
    @Test func junkNamesDoNotStopThePruning() async throws {
        let (folder, a, _) = devices()
        let now = a.serverNow()
        for i in 0 ..< 1_100 {
            try await folder.create(S3Objects.logFolder + "+junk\(i)", Data("x".utf8))
        }
        for i in 0 ..< 1_100 {
            try await folder.create(S3Objects.logFolder + String(format: "0000000000000junk%04d", i), Data("x".utf8))
        }
        let old = ChangeLog.name(time: now - 3_600_000, device: "x")
        let young = ChangeLog.name(time: now - 60_000, device: "x")
        for name in [old, young] { try await folder.create(S3Objects.logFolder + name, Data(#"{"op":"put","key":"k"}"#.utf8)) }
        try await a.prune(olderThan: 1800)
        let left = Set(try folder.names())
        #expect(!left.contains(old) && left.contains(young) && left.count == 2_201)
    }
}

extension ChangeLogInAFolderTests {
    /// What a log object not sealed with the bucket's key says its puts wrote is not taken: its
    /// entries stay hints (the reader asks the bucket for each key), whether the object has no
    /// seal (another tool's, a forger's), another key's, or bytes changed after sealing. A
    /// device's own sealed object is taken at its word. (A forged entry matching an object's
    /// listing made a reader show its false metadata.)
    @Test func onlySealedLogObjectsAreTakenAtTheirWord() async throws {
        let (folder, a, b) = devices()
        let start = b.serverNow()
        a.record(put("docs/real", "v1"))
        try await a.publish()
        let forged = #"{"at":1800000000000,"key":"docs/x","meta":{"kind":"file","mode":511,"uid":0,"gid":0,"mtimeNs":0,"xattrs":{"user.evil":"eA=="}},"op":"put","size":3,"tag":"\"t\"","version":"\"t\"~abc"}"#
        let unsealed = ChangeLog.name(time: start + 1, device: "x")
        try await folder.create(S3Objects.logFolder + unsealed, Data((forged + "\n").utf8))
        let otherKey = ChangeLog.name(time: start + 2, device: "y")
        let other = BucketSeal(secret: "another secret", bucket: "b", prefix: "drive/")
        try await folder.create(S3Objects.logFolder + otherKey, other.sealed(Data((forged + "\n").utf8), name: otherKey))
        // Sealed with the right key, then changed.
        let changed = ChangeLog.name(time: start + 3, device: "z")
        let sealedBody = String(decoding: Self.seal.sealed(Data((forged + "\n").utf8), name: changed), as: UTF8.self)
        let body = Data(sealedBody.replacingOccurrences(of: #""mode":511"#, with: #""mode":510"#).utf8)
        try await folder.create(S3Objects.logFolder + changed, body)
        // The right seal on another object's name.
        let moved = ChangeLog.name(time: start + 4, device: "w")
        try await folder.create(S3Objects.logFolder + moved, Self.seal.sealed(Data((forged + "\n").utf8), name: "elsewhere"))
        let read = try await b.look(from: start, markOnly: false)
        #expect(read.changes.count == 5, "\(read.changes)")
        #expect(read.changes[0].key == "docs/real" && read.changes[0].claimed != nil && read.notes[0].at != nil)
        #expect(read.changes.dropFirst().allSatisfy { $0.key == "docs/x" && $0.claimed == nil }, "\(read.changes)")
        #expect(read.notes.dropFirst().allSatisfy { $0.at == nil } && read.unsealed == 4)
    }
}

/// A value behind a lock, for closures the log calls from its own tasks.
final class Locked<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: T
    init(_ value: T) { self.value = value }
    func withLock<R>(_ body: (inout T) -> R) -> R { lock.withLock { body(&value) } }
}

/// The change log's objects as files in a folder: a create never writes over a file (it links
/// a finished file into place), a listing pages by name after a given one, a read past its
/// `atMost` is cut.
final class FolderLogObjects: LogObjects, @unchecked Sendable {
    let root: URL
    init(_ root: URL) { self.root = root }

    private func url(_ path: String) -> URL { root.appendingPathComponent(path) }

    func create(_ path: String, _ body: Data) async throws {
        let target = url(path)
        try FileManager.default.createDirectory(at: target.deletingLastPathComponent(), withIntermediateDirectories: true)
        let temp = target.deletingLastPathComponent().appendingPathComponent(".tmp-\(UUID().uuidString)")
        try body.write(to: temp)
        defer { unlink(temp.path) }
        if link(temp.path, target.path) != 0 {
            if errno == EEXIST { throw StoreError.preconditionFailed(key: path, current: nil) }
            throw StoreError.failed("link \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// Objects whose reads fail (the server's hiccup, or one it never serves), by path.
    let failing = Locked<Set<String>>([])

    func read(_ path: String, atMost: Int, expectedLength: Int?) async throws -> Data {
        if failing.withLock({ $0.contains(path) }) { throw StoreError.unavailable("\(path): 503 SlowDown") }
        guard let data = FileManager.default.contents(atPath: url(path).path) else { throw StoreError.notFound(key: path) }
        // As S3 answers a ranged GET of an empty object: 416 InvalidRange.
        if data.isEmpty { throw StoreError.failed("GET \(path) answered 416: The requested range is not satisfiable") }
        return data.prefix(atMost)
    }

    func listPage(_ folder: String, after: String, token: String?) async throws -> LogListingPage {
        let dir = url(folder)
        let all = ((try? FileManager.default.contentsOfDirectory(atPath: dir.path)) ?? [])
            .filter { !$0.hasPrefix(".tmp-") }
            .sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
        let from = token ?? after
        let names = all.filter { Array(from.utf8).lexicographicallyPrecedes(Array($0.utf8)) }
        var page = LogListingPage(date: Date())
        for name in names.prefix(1000) {
            let size = (try? FileManager.default.attributesOfItem(atPath: dir.appendingPathComponent(name).path)[.size] as? Int) ?? nil
            page.names.append((name, size))
        }
        if names.count > 1000 { page.next = names[999] }
        return page
    }

    func remove(_ path: String) async throws {
        if unlink(url(path).path) != 0 && errno != ENOENT {
            throw StoreError.failed("unlink \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// The log objects' names, and what one holds.
    func names() throws -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: url(S3Objects.logFolder).path)) ?? []).filter { !$0.hasPrefix(".tmp-") }
    }

    func contents(_ name: String) throws -> Data {
        try Data(contentsOf: url(S3Objects.logFolder + name))
    }
}
