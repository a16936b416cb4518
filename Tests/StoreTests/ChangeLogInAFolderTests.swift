import Foundation
import Testing
import TestSupport
import UbiqStore
@testable import UbiqS3

/// The change log's own logic (S3ChangeLog: batches, moves held back and logged whole, the
/// deletes a move waits with, reading, pruning) over log objects kept in a plain folder, so it
/// runs in milliseconds without a server; S3ChangeLogTests runs it again on SeaweedFS, through
/// the S3 store.
@Suite struct ChangeLogInAFolderTests {
    let meta = ObjectMetadata(kind: .file, mode: 0o644, uid: 1000, gid: 1000, mtimeNs: 1_700_000_000_000_000_000)

    func put(_ key: String, _ version: String, from: String? = nil, row: Int64? = nil) -> S3ChangeLog.Entry {
        .init(op: "put", key: key, version: version,
              wrote: ObjectInfo(key: key, version: version, size: 3, metadata: meta, contentTag: "\"t-\(version)\""),
              at: 1_800_000_000_000, row: row, from: from)
    }

    func devices() -> (FolderLogObjects, S3ChangeLog, S3ChangeLog) {
        let folder = FolderLogObjects(TempPaths.make("ubiq-log"))
        let a = S3ChangeLog(objects: folder, device: "a"), b = S3ChangeLog(objects: folder, device: "b")
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
        let body = String(decoding: try folder.contents(names[0]), as: UTF8.self)
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
        let old = S3ChangeLog.name(time: now - 3_600_000, device: "x")
        let young = S3ChangeLog.name(time: now - 60_000, device: "x")
        for name in [old, young, "not-a-log-object"] {
            try await folder.create(S3ChangeLog.folder + name, Data(#"{"op":"put","key":"k"}"#.utf8))
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
        try await folder.create(S3ChangeLog.folder + S3ChangeLog.name(time: start, device: "other"),
                                Data(lines.joined(separator: "\n").utf8))
        let read = try await b.look(from: start, markOnly: false)
        #expect(read.changes.map(\.key) == ["good", "gone"])
        #expect(read.unreadable.count == 4, "\(read.unreadable.lines)")
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

    func read(_ path: String, atMost: Int, expectedLength: Int?) async throws -> Data {
        guard let data = FileManager.default.contents(atPath: url(path).path) else { throw StoreError.notFound(key: path) }
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
        ((try? FileManager.default.contentsOfDirectory(atPath: url(S3ChangeLog.folder).path)) ?? []).filter { !$0.hasPrefix(".tmp-") }
    }

    func contents(_ name: String) throws -> Data {
        try Data(contentsOf: url(S3ChangeLog.folder + name))
    }
}
