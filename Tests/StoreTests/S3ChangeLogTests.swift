import Foundation
import Logging
import Testing
import TestSupport
@testable import UbiqStore
@testable import UbiqS3

/// The bucket's change log (ChangeLog), on a real SeaweedFS: another device's changes come
/// from it in a request or two whatever the bucket holds; what it lacks comes from the full
/// listing; what is in it cannot hurt a reader.
@Suite struct S3ChangeLogTests {
    let meta = fileMeta

    /// The names of the log objects in the bucket.
    func logObjects(_ store: S3Store) async throws -> [String] {
        let folder = store.objects.prefix + S3Objects.logFolder
        let r = try await store.objects.client.send(.GET, key: nil, query: [("list-type", "2"), ("prefix", folder)])
        return S3Client.xmlBlocks("Contents", in: r.text).compactMap { S3Client.xmlValue("Key", in: $0) }.map { String($0.dropFirst(folder.count)) }
    }

    /// A log object's bytes, read as a device reads them: its length from the listing, so that a
    /// busy server's empty answer is asked again (SeaweedFS under load has answered a GET with
    /// no bytes: a clean-clone run read this test's log object as empty once, and crashed on it).
    func logObject(_ store: S3Store, _ name: String) async throws -> Data {
        let folder = store.objects.prefix + S3Objects.logFolder
        let r = try await store.objects.client.send(.GET, key: nil, query: [("list-type", "2"), ("prefix", folder + name)])
        let size = S3Client.xmlBlocks("Contents", in: r.text).compactMap { S3Client.xmlValue("Size", in: $0) }.first.flatMap { Int($0) }
        return try await store.objects.read(S3Objects.logFolder + name, atMost: ChangeLog.maxObjectBytes, expectedLength: size)
    }

    /// A log object as a device with the bucket's key writes it (sealed: `BucketSeal`), whatever it holds.
    func putLog(_ store: S3Store, _ name: String, _ body: String) async throws {
        let sealed = store.objects.seal.sealed(Data(body.utf8), name: name)
        try await store.objects.client.send(.PUT, key: store.objects.prefix + S3Objects.logFolder + name, body: .data(sealed))
    }

    /// Device B follows device A's puts, copies and deletes through the log: one LIST and one
    /// GET per log object, then one LIST a poll while nothing changes. Another tool's object
    /// is not in the log; the full listing, when asked for, finds it. A cursor older than the
    /// latest is a reset.
    @Test func anotherDevicesChangesComeFromTheLog() async throws {
        let (a, b, clean) = try await twoDevices()
        defer { clean() }
        var cursor = try await b.currentCursor()
        #expect(b.lastLook.full)
        let x = try await a.put("x", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent)
        let y = try await a.put("y", contentsOf: try tempFile([2]), metadata: meta, condition: .ifAbsent)
        try await a.delete("y", condition: .always)
        let z = try await a.copy(from: "x", version: x.version, to: "docs/z", metadata: nil, condition: .ifAbsent)
        try await a.publishChanges()
        let written = try await logObjects(a).count
        #expect(written >= 1)
        let batch = try await b.changes(since: cursor, limit: 1000)
        #expect(!b.lastLook.full && b.lastLook.requests == 1 + written, "\(b.lastLook) for \(written) log objects")
        #expect(batch.changes.map(\.key) == ["x", "y", "y", "docs/z"])
        #expect(batch.changes.map(\.kind) == [.put, .put, .delete, .put])
        #expect(batch.changes.map(\.version) == [x.version, y.version, nil, z.version])
        #expect(batch.unreadable.isEmpty, "\(batch.unreadable)")
        cursor = batch.cursor

        // Nothing new: one request, nothing found.
        let idle = try await b.changes(since: cursor, limit: 1000)
        #expect(idle.changes.isEmpty && b.lastLook.requests == 1 && !b.lastLook.full, "\(b.lastLook)")
        cursor = idle.cursor

        // Another tool's object: not in the log; found by the full listing.
        try await a.objects.client.send(.PUT, key: "drive/foreign.txt", body: .data(Data("f".utf8)))
        let quiet = try await b.changes(since: cursor, limit: 1000)
        #expect(quiet.changes.isEmpty)
        cursor = quiet.cursor
        b.lookEverywhereNext()
        let full = try await b.changes(since: cursor, limit: 1000)
        #expect(b.lastLook.full && full.changes.map(\.key).contains("foreign.txt"), "\(full.changes)")
        cursor = full.cursor
        // The full listing noted the log objects there were as read.
        let after = try await b.changes(since: cursor, limit: 1000)
        #expect(after.changes.isEmpty && b.lastLook.requests == 1)

        // A cursor older than the latest, or another index's, is a reset, never a silent miss.
        #expect(try await b.changes(since: batch.cursor, limit: 1000).reset)
        #expect(try await b.changes(since: "elsewhere:4@\(Int64(Date().timeIntervalSince1970 * 1000))", limit: 1000).reset)
    }

    /// A look at the log whose changes never reach the caller (a later log object could not be
    /// fetched, the index could not move its cursor) marks nothing as read: the next look with
    /// the same cursor finds the same changes. (A look that threw part way used to leave the
    /// objects it had read marked, and their changes were lost until the next full listing.)
    @Test func aLookWhoseChangesWereNotTakenIsDoneAgain() async throws {
        let (a, b, clean) = try await twoDevices()
        defer { clean() }
        let cursor = try await b.currentCursor()
        _ = try await a.put("x", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent)
        try await a.publishChanges()
        let position = cursor.split(separator: "@").last.map(String.init) ?? ""
        let from = try #require(Int64(position))
        let lost = try await b.log.look(from: from, markOnly: false)
        #expect(lost.changes.map(\.key) == ["x"])
        let batch = try await b.changes(since: cursor, limit: 1000)
        #expect(batch.changes.map(\.key) == ["x"] && !batch.reset, "\(batch)")
        // Taken this time: the next look passes it over.
        let idle = try await b.changes(since: batch.cursor, limit: 1000)
        #expect(idle.changes.isEmpty && b.lastLook.requests == 1, "\(idle.changes) \(b.lastLook)")
    }

    /// Log objects are hints from anyone who can write to the bucket: lines that are not
    /// entries, operations of a newer version, keys that are not names or are the store's own,
    /// a name that is not a log object's, one dated a year ahead, and one larger than a reader
    /// takes. The good entries are read, each bad one is described once, nothing throws, and
    /// none is read twice.
    @Test func whatALogObjectHoldsCannotHurtAReader() async throws {
        let (b, clean) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400)
        defer { clean() }
        let cursor = try await b.currentCursor()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try await putLog(b, "\(ChangeLog.timeText(now))-other-1", """
            {"op":"put","key":"good"}
            not json
            {"op":"rename","key":"a","to":"b"}
            {"op":"put","key":"../etc/passwd"}
            {"op":"put","key":".ubiquity/s3/meta/x"}
            {"op":"put"}
            {"op":"delete","key":"gone","version":"v1","from":"a newer client"}
            {"op":"move","from":"a/","to":"b/","items":[{"name":"x","version":"v2","size":"big"},{"name":"../y"}]}
            {"op":"move","from":"c/","to":".ubiquity/s3/","items":[{"name":"z"}]}
            {"op":"move","from":"d","to":"d","items":[{"name":""}]}
            {"op":"move","from":"e/","items":[]}
            """)
        try await putLog(b, "not-a-log-object", #"{"op":"put","key":"never"}"#)
        try await putLog(b, "\(ChangeLog.timeText(now + 365 * 86_400_000))-other-2", #"{"op":"put","key":"ahead"}"#)
        let line = #"{"op":"put","key":"big"}"# + "\n"
        try await putLog(b, "\(ChangeLog.timeText(now))-other-3",
                         String(repeating: line, count: ChangeLog.maxObjectBytes / line.utf8.count + 1000))
        let batch = try await b.changes(since: cursor, limit: 1000)
        #expect(Set(batch.changes.map(\.key)) == ["good", "gone", "ahead", "big", "a/x", "b/x"])
        #expect(batch.changes.first { $0.key == "gone" } == StoreChange(kind: .delete, key: "gone", version: "v1"))
        // A move's good item: its old key's delete and its new key's put (a wrong size makes
        // it claim nothing); its bad ones are passed over.
        #expect(batch.changes.filter { $0.key.hasPrefix("a/") || $0.key.hasPrefix("b/") }
            == [StoreChange(kind: .delete, key: "a/x", version: nil), StoreChange(kind: .put, key: "b/x", version: "v2")])
        #expect(batch.changes.filter { $0.key == "big" }.count == ChangeLog.maxObjectBytes / line.utf8.count)
        let why = batch.unreadable.joined(separator: "\n")
        #expect(batch.unreadable.count == 10, "\(why)")
        for part in ["line 2: not an entry", "line 3: an operation this version does not know (\"rename\")", "dot segment",
                     "reserved", "line 6: not an entry", "other-3, line \(ChangeLog.maxObjectBytes / line.utf8.count + 1): not an entry",
                     "line 8: a move's item: invalid key \"a/../y\"", "line 9: a move's item: invalid key \".ubiquity/s3/z\"",
                     "line 10: a move's item: invalid key \"d\": moved onto itself", "line 11: not an entry"] {
            #expect(why.contains(part), "\(part) in \(why)")
        }
        let again = try await b.changes(since: batch.cursor, limit: 1000)
        #expect(again.changes.isEmpty && again.unreadable.isEmpty, "\(again.changes) \(again.unreadable)")
    }

    /// A log object a busy server answers with an empty body (SeaweedFS did, with headers that
    /// agreed: a 200 of no bytes) is asked for again, by its size in the listing, and its
    /// changes are read. Taken at its word, the object read as empty and was noted as read: its
    /// changes were lost until the next full listing. One that stays wrong is left for the next
    /// look, which reads it again.
    @Test func aLogObjectABusyServerAnswersEmptyIsAskedAgain() async throws {
        let body = Data((#"{"op":"put","key":"good"}"# + "\n").utf8)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let listing = ScriptedHTTPServer.Answer(200, body: Data("""
            <ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>drive/.ubiquity/s3/log/\(ChangeLog.timeText(now))-other-1</Key>\
            <Size>\(body.count)</Size></Contents></ListBucketResult>
            """.utf8))
        let empty = ScriptedHTTPServer.Answer(200, body: Data())
        let whole = ScriptedHTTPServer.Answer(206, headers: [("Content-Range", "bytes 0-\(body.count - 1)/\(body.count)")], body: body)
        func log(_ server: ScriptedHTTPServer) -> ChangeLog {
            let client = S3Client(endpoint: S3Endpoint(url: server.endpoint, region: "us-east-1", bucket: "b",
                                                       credentials: S3Credentials(accessKey: "k", secretKey: "s")),
                                  logger: Logger(label: "s3-test"), attempts: 4)
            let objects = S3Objects(client: client, prefix: "drive", versioned: false)
            return ChangeLog(objects: objects, reserved: S3Objects.reserved, device: "me", seal: objects.seal)
        }
        let busy = try ScriptedHTTPServer([listing, empty, whole])
        defer { busy.stop() }
        let read = try await log(busy).look(from: now, markOnly: false)
        #expect(read.changes.map(\.key) == ["good"] && read.unreadable.lines.isEmpty, "\(read.changes) \(read.unreadable.lines)")
        #expect(busy.requests.count == 3)

        // One that stays wrong is left for the next look (not noted as read), and holds back
        // nothing else: the look goes on.
        let stubborn = try ScriptedHTTPServer([listing] + Array(repeating: empty, count: 4))
        defer { stubborn.stop() }
        let left = try await log(stubborn).look(from: now, markOnly: false)
        #expect(left.changes.isEmpty && left.unreadLeft == 1 && left.logObjects.isEmpty && !left.whole, "\(left)")
        #expect(stubborn.requests.count == 5)
    }

    /// A log object of nothing but bad lines: its first few are said, the rest counted in one
    /// line; memory and ubiq.log do not grow with what a hostile writer puts there.
    @Test func aFloodOfBadLinesIsCounted() async throws {
        let (b, clean) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400)
        defer { clean() }
        let cursor = try await b.currentCursor()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try await putLog(b, "\(ChangeLog.timeText(now))-other-1", String(repeating: "x\n", count: 50_000))
        let batch = try await b.changes(since: cursor, limit: 1000)
        #expect(batch.changes.isEmpty && batch.unreadable.count == PassedOver.kept + 1)
        #expect(batch.unreadable.last == "… and \(50_000 - PassedOver.kept) more like these")
    }

    /// Log objects older than the retention go at a full listing; younger ones stay. A full
    /// listing comes when its interval has passed, without being asked (that none comes before
    /// is `anotherDevicesChangesComeFromTheLog`).
    @Test func oldLogObjectsGoAndTheFullListingComesByItself() async throws {
        let (b, clean) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 1)
        defer { clean() }
        var cursor = try await b.currentCursor()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let old = "\(ChangeLog.timeText(now - Int64(b.logRetention * 1000) - 60_000))-other-1"
        let young = "\(ChangeLog.timeText(now - 60_000))-other-2"
        try await putLog(b, old, #"{"op":"put","key":"a"}"#)
        try await putLog(b, young, #"{"op":"put","key":"b"}"#)
        cursor = try await b.changes(since: cursor, limit: 1000).cursor
        try await Task.sleep(for: .seconds(1.1))
        _ = try await b.changes(since: cursor, limit: 1000)
        #expect(b.lastLook.full, "no full listing once its interval had passed")
        #expect(try await logObjects(b) == [young])
    }

    /// A change made outside an upload round (no `publishChanges`) goes to the log by itself
    /// within a moment.
    @Test func aChangeOutsideARoundIsLoggedSoon() async throws {
        let (a, clean) = try await SeaweedFS.shared().newStore(versioned: false)
        defer { clean() }
        _ = try await a.put("k", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent)
        var logged: [String] = []
        let deadline = Date(timeIntervalSinceNow: 120)  // a guard against a hang on a busy machine
        while logged.isEmpty && Date() < deadline {
            logged = try await logObjects(a)
            if logged.isEmpty { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(logged.count == 1 && logged.first?.contains("-\(a.index.id)-") == true, "\(logged)")
    }

    /// A device killed between a write and the log object that names it: the write was noted
    /// in its index first, and its next run publishes it, so another device following the log
    /// alone sees the change (not only the next full listing, minutes later). Published, the
    /// note goes: a third run publishes nothing again.
    @Test func aWriteWhoseLogObjectACrashPreventedIsLoggedByTheNextRun() async throws {
        // A is the device that comes back.
        let (b, a, comeBack, clean) = try await twoDevicesOneComingBack()
        defer { clean() }
        let cursor = try await b.currentCursor()
        // The "crash": a writes, and its log object is never written.
        a.log.publishesBySelf = false
        let x = try await a.put("x", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent)
        try await a.delete("gone", condition: .always)
        try await Task.sleep(for: .seconds(1))
        #expect(try await logObjects(a).isEmpty)
        #expect(a.index.unlogged().map(\.key) == ["x", "gone"])

        // The same device again (its index), as the mount after the crash is.
        let (again, cleanAgain) = try await comeBack()
        defer { cleanAgain() }
        try await again.publishChanges()
        #expect(try await logObjects(again).count == 1)
        #expect(again.index.unlogged().isEmpty)
        let batch = try await b.changes(since: cursor, limit: 1000)
        #expect(!b.lastLook.full)
        #expect(batch.changes.map(\.key) == ["x", "gone"] && batch.changes.map(\.kind) == [.put, .delete], "\(batch.changes)")
        let seen = try await b.head("x")
        #expect(seen.version == x.version)

        // Published: nothing left to publish.
        let (third, cleanThird) = try await comeBack()
        defer { cleanThird() }
        try await third.publishChanges()
        #expect(try await logObjects(third).count == 1)
    }

    /// A long stream of changes (a folder of many files moved: a copy and a delete each) goes in
    /// a few log objects, what half a second or a round brought, not one per change or two:
    /// every reader fetches every log object. All of it is there, in order, after the round.
    @Test func aStreamOfChangesGoesInFewLogObjects() async throws {
        let (a, b, clean) = try await twoDevices()
        defer { clean() }
        let cursor = try await b.currentCursor()
        let started = Date()
        // Two seconds of them: the log is written meanwhile (every half second), not only at the end.
        var n = 0
        while Date().timeIntervalSince(started) < 2 {
            try await a.delete("gone/\(n)", condition: .always)
            n += 1
        }
        try await a.publishChanges()
        let seconds = Date().timeIntervalSince(started)
        let objects = try await logObjects(a).count
        // One a half second at most while the deletes went on, and the round's own.
        #expect(objects <= Int(seconds / 0.5) + 2, "\(objects) log objects for \(n) changes in \(seconds) s")
        var keys: [String] = []
        var at = cursor
        while true {
            let batch = try await b.changes(since: at, limit: 1000)
            keys += batch.changes.map(\.key)
            at = batch.cursor
            if !batch.more { break }
        }
        let wanted = (0 ..< n).map { "gone/\($0)" }
        let firstAmiss = (0 ..< min(keys.count, wanted.count)).first { keys[$0] != wanted[$0] } ?? min(keys.count, wanted.count)
        let inOrder = keys == wanted
        #expect(inOrder, "\(keys.count) of \(n) changes read; the first out of place at \(firstAmiss)")
    }

    /// A folder moved over several upload rounds (a copy and a delete a file, rounds that
    /// follow one another hold them back): nothing of it is in the log until the last round,
    /// then one log object with one `move` entry for the whole folder, which the reader takes
    /// as a delete and a put a file, told by one listing of each folder. Meanwhile the old keys
    /// are still there for the reader (the deletes wait for the log object), and gone for the
    /// writer's listings. A move left held (no round ends it) goes once no change came for
    /// `moveQuiet`.
    @Test func aFolderMovedInRoundsGoesToTheLogWhole() async throws {
        let (a, b, clean) = try await twoDevices()
        defer { clean() }
        a.log.publishesBySelf = false
        var cursor = try await b.currentCursor()
        var made: [ObjectInfo] = []
        for i in 0 ..< 39 {
            let key = i < 26 ? "docs/f\(i)" : "docs/sub/f\(i)"
            made.append(try await a.put(key, contentsOf: try tempFile(Array("file \(i)".utf8)), metadata: meta, condition: .ifAbsent))
        }
        try await a.publishChanges()
        cursor = try await look(b, from: cursor).cursor
        let before = try await logObjects(a)
        for (i, info) in made.enumerated() {
            _ = try await a.copy(from: info.key, version: info.version, to: "moved/" + info.key.dropFirst(5), metadata: nil, condition: .ifAbsent)
            try await a.deleteMoved(info.key, version: info.version, to: "moved/" + info.key.dropFirst(5))
            if i % 10 == 9 {
                try await a.publishChanges(holdingMoves: true)
                #expect(try await logObjects(a) == before, "a round of a move under way wrote to the log")
                let (changes, next) = try await look(b, from: cursor)
                #expect(changes.isEmpty, "\(changes)")
                cursor = next
                #expect(try await b.head(made[0].key).version == made[0].version, "a moved file's old key went before the log told of it")
                #expect(try await b.read(made[i].key, version: made[i].version, range: 0 ..< 4) == Data("file".utf8))
                let listed = Set(try await a.list(prefix: "docs/").map(\.key))
                #expect(listed == Set(made[(i + 1)...].map(\.key)), "the writer lists what it has not moved, and only that")
            }
        }
        try await a.publishChanges(holdingMoves: false)
        for info in made {
            await #expect(throws: StoreError.self, "\(info.key) is left after its move's log object") { try await b.head(info.key) }
        }
        let added = try await logObjects(a).filter { !before.contains($0) }
        #expect(added.count == 1)
        let name = try #require(added.first)
        let raw = try await logObject(a, name)
        let (opened, sealed) = a.objects.seal.opened(raw, name: name)
        #expect(sealed, "\(raw.count) bytes")
        let body = String(decoding: opened, as: UTF8.self)
        let lines = body.split(separator: "\n")
        #expect(lines.count == 1 && lines.first?.contains(#""op":"move""#) == true, "\(body.prefix(300))")
        let move = try JSONDecoder().decode(ChangeLog.Move.self, from: Data(try #require(lines.first).utf8))
        #expect(move.from == "docs/" && move.to == "moved/" && move.items.count == 39)
        let (changes, _) = try await look(b, from: cursor)
        #expect(changes.count == 78 && changes.filter { $0.kind == .delete }.map(\.key).sorted() == made.map(\.key).sorted())
        let told = await b.confirmed(changes)
        #expect(b.lastLook.requests == 1 + 1 + 4, "a LIST of the log, a GET, a LIST each of docs/, docs/sub/, moved/, moved/sub/: \(b.lastLook)")
        try await expectAsTheStoreHasIt(told, b)

        // Held, then no round ends it: it goes once nothing was noted for a while.
        let one = try await a.put("lone", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent)
        try await a.publishChanges()
        let logged = try await logObjects(a)
        _ = try await a.copy(from: "lone", version: one.version, to: "lone2", metadata: nil, condition: .ifAbsent)
        try await a.deleteMoved("lone", version: one.version, to: "lone2")
        try await a.publishChanges(holdingMoves: true)
        #expect(try await logObjects(a) == logged)
        try await Task.sleep(for: .seconds(ChangeLog.moveQuiet + 0.1))
        try await a.publishChanges(holdingMoves: true)
        #expect(try await logObjects(a).count == logged.count + 1)
    }

    /// A move's delete waits for its log object, in the index too: a crash before that log
    /// object leaves the old key, and the next run deletes it (if it still holds the version
    /// moved) before it logs the change. One the key changed under meanwhile (another
    /// device wrote it) is not made, and not logged. Anything else this device does with a
    /// key whose delete waits makes that delete first.
    @Test func aMovesDeleteWaitsForItsLogObjectAndSurvivesACrash() async throws {
        let (b, a, comeBack, clean) = try await twoDevicesOneComingBack()
        defer { clean() }
        var made: [String: ObjectInfo] = [:]
        for k in ["x", "y", "z", "w"] {
            made[k] = try await a.put(k, contentsOf: try tempFile(Array(k.utf8)), metadata: meta, condition: .ifAbsent)
        }
        try await a.publishChanges()
        let cursor = try await b.currentCursor()
        a.log.publishesBySelf = false
        for k in ["x", "y", "z", "w"] {
            _ = try await a.copy(from: k, version: made[k]!.version, to: k + "2", metadata: nil, condition: .ifAbsent)
            try await a.deleteMoved(k, version: made[k]!.version, to: k + "2")
        }
        // Another device writes y meanwhile: the move's delete of y is refused (its new version stays).
        let theirs = try await b.put("y", contentsOf: try tempFile([9]), metadata: meta, condition: .ifMatch(made["y"]!.version))
        // This device writes z anew: the delete that waited is made first (else the create would be refused).
        let mine = try await a.put("z", contentsOf: try tempFile([7]), metadata: meta, condition: .ifAbsent)
        // And asks what w holds: gone, as it deleted it.
        await #expect(throws: StoreError.self) { try await a.head("w") }
        #expect(try await b.head("x").version == made["x"]!.version, "the delete of x was made before its log object")
        #expect(Set(a.index.deferred().map(\.key)) == ["x", "y"])

        // The "crash": a new run on the same index.
        let (again, cleanAgain) = try await comeBack()
        defer { cleanAgain() }
        try await again.publishChanges()
        await #expect(throws: StoreError.self) { try await b.head("x") }
        #expect(try await b.head("y").version == theirs.version)
        #expect(try await b.head("z").version == mine.version)
        #expect(again.index.deferred().isEmpty && again.index.unlogged().isEmpty)
        let (changes, _) = try await look(b, from: cursor)
        let told = Dictionary(changes.map { ($0.key, $0.kind) }, uniquingKeysWith: { $1 })
        #expect(told["x"] == .delete && told["x2"] == .put && told["w"] == .delete, "\(changes)")
        let deletes = changes.filter { $0.kind == .delete }.map(\.key)
        #expect(!deletes.contains("y"), "a delete that was refused was logged: \(changes)")
    }

    /// Too many entries waiting for the log (a store that takes copies but not log objects):
    /// the oldest go as they are noted, the newest when a batch comes back, but a move's delete
    /// that waits never does (dropped, it would never be made: the old key would stay).
    @Test func entriesDroppedAreNeverAMovesDelete() {
        func e(_ key: String, deferred: Bool = false) -> ChangeLog.Entry {
            .init(op: deferred ? "delete" : "put", key: key, version: deferred ? nil : "v", deferred: deferred)
        }
        let entries = [e("a"), e("m1", deferred: true), e("b"), e("c"), e("m2", deferred: true), e("d")]
        #expect(ChangeLog.trimmed(entries, to: 4, droppingNewest: false).map(\.key) == ["m1", "c", "m2", "d"])
        #expect(ChangeLog.trimmed(entries, to: 4, droppingNewest: true).map(\.key) == ["a", "m1", "b", "m2"])
        #expect(ChangeLog.trimmed(entries, to: 1, droppingNewest: true).map(\.key) == ["m1", "m2"])
        #expect(ChangeLog.trimmed(entries, to: 6, droppingNewest: true) == entries)
    }

    /// How a move's keys split into the folders moved and a name, and the lines a batch of
    /// entries goes to the log as: a copy and the delete of its source as a move's item.
    @Test func aMoveIsLoggedByItsFolders() throws {
        #expect(ChangeLog.Move.split(from: "A/sub/x", to: "B/sub/x") == ("A/", "B/", "sub/x"))
        #expect(ChangeLog.Move.split(from: "A/", to: "B/") == ("A/", "B/", ""))
        #expect(ChangeLog.Move.split(from: "A/x", to: "A/y") == ("A/x", "A/y", ""))
        #expect(ChangeLog.Move.split(from: "x/a", to: "y/x/a") == ("", "y/", "x/a"))
        #expect(ChangeLog.Move.split(from: "ab/c", to: "b/c") == ("ab/", "b/", "c"))
        #expect(ChangeLog.Move.split(from: "é/ü", to: "ü") == ("é/", "", "ü"))
        typealias E = ChangeLog.Entry
        let batch = [
            E(op: "put", key: "B/x", version: "v1", from: "A/x"),
            E(op: "put", key: "other", version: "v9"),
            E(op: "delete", key: "A/x", version: nil),
            E(op: "put", key: "B/y", version: "v2", from: "A/y"),  // its delete is not in this batch
            E(op: "put", key: "B/s/z", version: "v3", from: "A/s/z"),
            E(op: "delete", key: "A/s/z", version: nil),
            E(op: "put", key: "n2", version: "v4", from: "n1"),
            E(op: "delete", key: "n1", version: nil),
            E(op: "put", key: "same", version: "v5", from: "same"),
        ]
        #expect(batch[8].from == nil, "a copy onto itself is no move")
        let lines = String(decoding: try ChangeLog.lines(batch), as: UTF8.self).split(separator: "\n").map(String.init)
        #expect(lines == [
            #"{"from":"A/","items":[{"name":"x","version":"v1"},{"name":"s/z","version":"v3"}],"op":"move","to":"B/"}"#,
            #"{"key":"other","op":"put","version":"v9"}"#,
            #"{"key":"B/y","op":"put","version":"v2"}"#,
            #"{"from":"n1","items":[{"name":"","version":"v4"}],"op":"move","to":"n2"}"#,
            #"{"key":"same","op":"put","version":"v5"}"#,
        ], "\(lines)")
    }

    /// Each change `store` told as its key is: a delete gone, a put what a HEAD says.
    func expectAsTheStoreHasIt(_ told: [StoreChange], _ store: S3Store) async throws {
        for c in told {
            if c.kind == .delete {
                #expect(c.current == .absent, "\(c.key)")
            } else {
                let head = try await store.head(c.key)
                #expect(c.current == .object(head), "\(c.key): told \(String(describing: c.current)), HEAD \(head)")
            }
        }
    }

    /// All the changes of a look, read whole.
    func look(_ store: S3Store, from cursor: String) async throws -> (changes: [StoreChange], cursor: String) {
        let batch = try await store.changes(since: cursor, limit: 1000)
        #expect(!batch.reset && !batch.more && batch.unreadable.isEmpty, "\(batch.unreadable)")
        return (batch.changes, batch.cursor)
    }

    /// A folder of files another device moved (a copy and a delete each): one listing of each
    /// of the two folders tells the reader what every key holds, exactly what a HEAD of each
    /// would have said, where it asked 2 HEADs a file before. A few changes in a folder are
    /// not worth a listing; a device's own puts are not listed for (the feed knows its own).
    @Test func aFolderMovedOnAnotherDeviceIsToldByTwoListings() async throws {
        let (a, b, clean) = try await twoDevices()
        defer { clean() }
        var cursor = try await b.currentCursor()
        let aCursor = try await a.currentCursor()
        let count = 30
        var made: [ObjectInfo] = []
        for i in 0 ..< count {
            var m = meta
            m.mode = 0o600 + UInt32(i % 8)
            m.xattrs = ["user.n": Data("\(i)".utf8)]
            made.append(try await a.put("docs/f\(i)", contentsOf: try tempFile(Array("file \(i)".utf8)), metadata: m, condition: .ifAbsent))
        }
        try await a.publishChanges()
        var logObjects = try await self.logObjects(a).count
        var (changes, next) = try await look(b, from: cursor)
        cursor = next
        var told = await b.confirmed(changes)
        #expect(b.lastLook.requests == 1 + logObjects + 1, "a LIST of the log, a GET a log object, one LIST of docs/: \(b.lastLook)")
        for (c, info) in zip(told, made) {
            let head = try await b.head(c.key)
            #expect(c.current == .object(head) && head == info, "\(c.key): told \(String(describing: c.current)), HEAD \(head)")
        }
        // The writer's own puts: no listing (its feed skips them by their origin).
        let own = try await a.changes(since: aCursor, limit: 1000)
        let ownTold = await a.confirmed(own.changes)
        #expect(ownTold.allSatisfy { $0.current == nil } && a.lastLook.requests == 1 + logObjects, "\(a.lastLook)")

        // The folder moved: a copy and a delete a file.
        for (i, info) in made.enumerated() {
            _ = try await a.copy(from: info.key, version: info.version, to: "moved/f\(i)", metadata: nil, condition: .ifAbsent)
            try await a.delete(info.key, condition: .always)
        }
        try await a.publishChanges()
        let before = logObjects
        logObjects = try await self.logObjects(a).count
        (changes, next) = try await look(b, from: cursor)
        cursor = next
        #expect(changes.count == 2 * count)
        told = await b.confirmed(changes)
        #expect(b.lastLook.requests == 1 + (logObjects - before) + 2, "one LIST of docs/ and one of moved/: \(b.lastLook)")
        try await expectAsTheStoreHasIt(told, b)

        // Three changes in a folder: a HEAD each is cheaper than a listing.
        for i in 0 ..< 3 { _ = try await a.put("few/f\(i)", contentsOf: try tempFile([UInt8(i)]), metadata: meta, condition: .ifAbsent) }
        try await a.publishChanges()
        (changes, next) = try await look(b, from: cursor)
        let requests = b.lastLook.requests
        told = await b.confirmed(changes)
        #expect(told.count == 3 && told.allSatisfy { $0.current == nil } && b.lastLook.requests == requests, "\(told)")
    }

    /// What a listing of a folder confirmed of the log is remembered: the next full listing
    /// tells those keys with what they hold, so the feed asks nothing of them (a folder of
    /// files moved on another device was a HEAD each there, after the log had told them).
    /// Only what was settled when it was confirmed (a second more may change it unseen).
    @Test func aFullListingAsksNothingTheLogAlreadyTold() async throws {
        let (a, b, clean) = try await twoDevices(settleWindow: 0)
        defer { clean() }
        let cursor = try await b.currentCursor()
        var made: [ObjectInfo] = []
        for i in 0 ..< 20 {
            made.append(try await a.put("docs/f\(i)", contentsOf: try tempFile(Array("file \(i)".utf8)), metadata: meta, condition: .ifAbsent))
        }
        try await a.publishChanges()
        let (changes, next) = try await look(b, from: cursor)
        let told = await b.confirmed(changes)
        #expect(told.count == 20 && told.allSatisfy { $0.current != nil }, "\(told)")
        // One more, told by the log alone (too few for a listing): its entry is borne out by
        // the full listing.
        let late = try await a.put("docs/late", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent)
        try await a.publishChanges()
        let (more, last) = try await look(b, from: next)
        #expect(more.map(\.key) == ["docs/late"])
        try await fullListingTells(b, since: last, made + [late])
    }

    /// A key this device learned of from the log alone, whose delete it never read (the log
    /// object lost, or deleted after the retention while the device was away), is told as gone
    /// by the next full listing: no listing had shown the key, so comparing listings alone never
    /// told it. Another tool's delete of a key the log told of is found the same way.
    @Test func aKeyTheLogToldOfAndTheListingLacksIsGone() async throws {
        let (a, b, clean) = try await twoDevices()
        defer { clean() }
        let cursor = try await b.currentCursor()
        for key in ["docs/kept", "docs/gone", "docs/other-tool"] {
            _ = try await a.put(key, contentsOf: try tempFile(Array(key.utf8)), metadata: meta, condition: .ifAbsent)
        }
        try await a.publishChanges()
        let (told, next) = try await look(b, from: cursor)
        #expect(Set(told.map(\.key)) == ["docs/kept", "docs/gone", "docs/other-tool"])
        // A deletes one and its log object is lost; another tool deletes another.
        let before = Set(try await logObjects(a))
        try await a.delete("docs/gone", condition: .always)
        try await a.publishChanges()
        for name in Set(try await logObjects(a)).subtracting(before) {
            try await a.objects.send(.DELETE, S3Objects.logFolder + name, validate: false)
        }
        try await a.objects.send(.DELETE, "docs/other-tool", validate: false)
        let (none, last) = try await look(b, from: next)
        #expect(none.isEmpty, "\(none)")
        b.lookEverywhereNext()
        let full = try await b.changes(since: last, limit: 1000)
        #expect(!full.reset)
        let deletes = Set(full.changes.filter { $0.kind == .delete }.map(\.key))
        #expect(deletes == ["docs/gone", "docs/other-tool"], "\(full.changes)")
        #expect(!full.changes.contains { $0.key == "docs/kept" && $0.kind == .delete })
        // Told once: the listing after it has nothing more to say of them.
        b.lookEverywhereNext()
        let again = try await b.changes(since: full.cursor, limit: 1000)
        #expect(!again.changes.contains { $0.kind == .delete }, "\(again.changes)")
    }

    /// A mount again lists the bucket once. The importer's listing, the run's first, marks the
    /// log's objects first, and the feed's first full listing, due at once, is that listing:
    /// it tells what changed while the device was away; what came after it comes by the log,
    /// and another tool's object by the next full listing, which lists anew. (The feed listed
    /// the bucket again: 1,000 LISTs at a million objects.)
    @Test func aMountAgainListsTheBucketOnce() async throws {
        let (a, b, comeBack, clean) = try await twoDevicesOneComingBack()
        defer { clean() }
        let start = try await b.currentCursor()
        for key in ["docs/x", "docs/y"] {
            _ = try await a.put(key, contentsOf: try tempFile(Array(key.utf8)), metadata: meta, condition: .ifAbsent)
        }
        try await a.publishChanges()
        let (told, away) = try await look(b, from: start)
        #expect(Set(told.map(\.key)) == ["docs/x", "docs/y"])
        // While B is away: a delete and a new file.
        try await a.delete("docs/x", condition: .always)
        _ = try await a.put("docs/z", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent)
        try await a.publishChanges()
        // B again (the same index): its importer lists the bucket.
        let (again, _) = try await comeBack()
        var listed: [String] = []
        try await again.list(prefix: "", pagesOf: 100) { listed += $0.map(\.key) }
        #expect(listed == ["docs/y", "docs/z"], "\(listed)")
        // Then A writes (logged) and another tool puts an object (not logged).
        _ = try await a.put("docs/w", contentsOf: try tempFile([2]), metadata: meta, condition: .ifAbsent)
        try await a.publishChanges()
        try await a.objects.send(.PUT, "docs/foreign", body: .data(Data("x".utf8)), validate: false)
        let first = try await again.changes(since: away, limit: 1000)
        #expect(again.lastLook.full && !first.reset)
        #expect(first.changes.contains { $0.key == "docs/x" && $0.kind == .delete }, "\(first.changes)")
        #expect(first.changes.contains { $0.key == "docs/z" && $0.kind == .put }, "\(first.changes)")
        #expect(!first.changes.contains { $0.key == "docs/w" || $0.key == "docs/foreign" }, "the importer's listing, not another: \(first.changes)")
        let next = try await again.changes(since: first.cursor, limit: 1000)
        #expect(!again.lastLook.full && next.changes.map(\.key) == ["docs/w"], "\(next.changes)")
        again.lookEverywhereNext()
        let full = try await again.changes(since: next.cursor, limit: 1000)
        #expect(again.lastLook.full && full.changes.contains { $0.key == "docs/foreign" }, "\(full.changes)")
    }

    /// A mount again after another device wrote files while this one was away takes them from
    /// the log's entries, borne out by the listing, not a HEAD each (10,000 files added: 10,000
    /// HEADs before): the first listing of a run reads the log from where this device last
    /// looked. An object the log does not tell of (another tool's) still gets its HEAD, and a
    /// device with no look saved, or more log objects since than are worth reading, gets
    /// HEADs as before.
    @Test func aMountAgainTakesWhatTheLogToldWithoutAHeadEach() async throws {
        let (a, b, comeBack, clean) = try await twoDevicesOneComingBack(settleWindow: 0)
        defer { clean() }
        let bucket = a.objects.client.endpoint.bucket
        let start = try await b.currentCursor()
        _ = try await a.put("docs/before", contentsOf: try tempFile([0]), metadata: meta, condition: .ifAbsent)
        try await a.publishChanges()
        _ = try await look(b, from: start)
        // While B is away: 30 files in two rounds, and another tool's object.
        var made: [ObjectInfo] = []
        for i in 0 ..< 30 {
            var m = meta
            m.mode = 0o600 + UInt32(i % 8)
            made.append(try await a.put("docs/f\(i)", contentsOf: try tempFile(Array("file \(i)".utf8)), metadata: m, condition: .ifAbsent))
            if i == 14 { try await a.publishChanges() }
        }
        try await a.publishChanges()
        try await a.objects.send(.PUT, "docs/foreign", body: .data(Data("x".utf8)), validate: false)
        let (again, cleanAgain) = try await comeBack()
        defer { cleanAgain() }
        var listed: [ObjectInfo] = []
        try await again.list(prefix: "", pagesOf: 100) { listed += $0 }
        #expect(listed.count == 32, "\(listed.map(\.key))")
        for info in made { #expect(listed.first { $0.key == info.key } == info, "\(info.key)") }
        #expect(again.headsForLastListing == 1, "only another tool's object is asked for: \(again.headsForLastListing) HEADs")
        // A new device reads the log since the latest snapshot (B's first full listing wrote
        // one of the empty bucket): the same, without a HEAD for what it told.
        let (fresh, cleanFresh) = try await SeaweedFS.shared().store(of: bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanFresh() }
        var seen: [ObjectInfo] = []
        try await fresh.list(prefix: "", pagesOf: 100) { seen += $0 }
        #expect(seen == listed && fresh.headsForLastListing == 1, "\(fresh.headsForLastListing) HEADs")
        // More log objects since the last look than are worth reading: a HEAD each, as before.
        let index2 = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3index-\(UUID().uuidString).db").path
        let (c, cleanC) = try await SeaweedFS.shared().store(of: bucket, fullListingInterval: 86_400, index: index2, settleWindow: 0)
        defer { cleanC() }
        let cStart = try await c.currentCursor()
        _ = try await c.list(prefix: "")  // (its import: what is there now, known)
        _ = try await look(c, from: cStart)
        for round in 0 ..< 2 {
            _ = try await a.put("more/r\(round)", contentsOf: try tempFile([UInt8(round)]), metadata: meta, condition: .ifAbsent)
            try await a.publishChanges()
        }
        let (cAgain, cleanCAgain) = try await SeaweedFS.shared().store(of: bucket, fullListingInterval: 86_400, index: index2, settleWindow: 0)
        defer { cleanCAgain() }
        cAgain.logObjectsReadAtAMountAgain = 1
        var cListed = 0
        try await cAgain.list(prefix: "", pagesOf: 100) { cListed += $0.count }
        #expect(cListed == 34 && cAgain.headsForLastListing == 2, "\(cListed) objects, \(cAgain.headsForLastListing) HEADs")
    }

    /// Two devices' stores on one new bucket, as `twoDevices`; the second's index stays on
    /// disk, so that it comes back (`comeBack`: its store opened again on that index, as a
    /// mount again or after a crash does; the caller cleans up after that one).
    func twoDevicesOneComingBack(settleWindow: TimeInterval? = nil) async throws -> (S3Store, S3Store, () async throws -> (S3Store, () -> Void), () -> Void) {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: settleWindow)
        let bucket = a.objects.client.endpoint.bucket
        let index = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3index-\(UUID().uuidString).db").path
        do {
            let (b, cleanB) = try await SeaweedFS.shared().store(of: bucket, fullListingInterval: 86_400, index: index, settleWindow: settleWindow)
            let comeBack = { try await SeaweedFS.shared().store(of: bucket, fullListingInterval: 86_400, index: index, settleWindow: settleWindow) }
            return (a, b, comeBack, { cleanB(); cleanA() })
        } catch {
            cleanA()
            throw error
        }
    }

    /// Two devices' stores on one new bucket, with no full listing by itself (a day apart,
    /// however slow the machine), and what removes them.
    func twoDevices(settleWindow: TimeInterval? = nil) async throws -> (S3Store, S3Store, () -> Void) {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: settleWindow)
        do {
            let (b, cleanB) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400,
                                                                 settleWindow: settleWindow)
            return (a, b, { cleanB(); cleanA() })
        } catch {
            cleanA()
            throw error
        }
    }

    /// A full listing of `store` after `since`, which tells each of `infos` as it is (no HEAD).
    @discardableResult
    func fullListingTells(_ store: S3Store, since: String, _ infos: [ObjectInfo]) async throws -> ChangeBatch {
        store.lookEverywhereNext()
        let full = try await store.changes(since: since, limit: 1000)
        #expect(!full.reset)
        for info in infos {
            let c = try #require(full.changes.first { $0.key == info.key })
            #expect(c.current == .object(info) && c.version == info.version, "\(info.key): \(c)")
        }
        return full
    }

    /// What bears out a log entry: the listing's ETag and size, and a time no later than a
    /// second after the write was answered (a later write of the same bytes, a `chmod` on another
    /// device or another tool's copy, is not the entry's).
    @Test func aListingBearsOutAnEntryByTagSizeAndTime() {
        let at: Int64 = 1_800_000_000_000
        let claim = ObjectInfo(key: "k", version: "\"e1\"~abc", size: 3, metadata: meta, contentTag: "\"e1\"")
        func listed(_ etag: String = "\"e1\"", size: Int64 = 3, ms: Int64?) -> ListedObject {
            ListedObject(key: "k", etag: etag, size: size, modified: ms.map { Date(timeIntervalSince1970: Double($0) / 1000) })
        }
        #expect(S3Store.bearsOut(listed(ms: at - 900), claim, at: at))
        #expect(S3Store.bearsOut(listed(ms: at + 1000), claim, at: at))
        #expect(!S3Store.bearsOut(listed(ms: at + 1001), claim, at: at))
        #expect(!S3Store.bearsOut(listed(ms: nil), claim, at: at))
        #expect(!S3Store.bearsOut(listed("\"e2\"", ms: at), claim, at: at))
        #expect(!S3Store.bearsOut(listed(size: 4, ms: at), claim, at: at))
        // Remembered only when settled: two seconds old when listed (another write in the same
        // second would show the same ETag, time and size).
        var listing = Listing(taken: Date())
        listing.taken = Date(timeIntervalSince1970: Double(at + 2000) / 1000)
        #expect(S3Store.settled(listed(ms: at), claim, in: listing))
        #expect(!S3Store.settled(listed(ms: at + 1), claim, in: listing))
    }

    /// Two puts of one key close in time (the same bytes, other metadata: a listing cannot tell
    /// them apart) leave nothing to take at the full listing; the later of two far apart is kept.
    @Test func claimsOfOneKeyCloseInTimeAreLeftToAHead() async throws {
        let (a, clean) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400)
        defer { clean() }
        func put(_ version: String, _ at: Int64) -> (key: String, claimed: ObjectInfo?, at: Int64?) {
            ("k", ObjectInfo(key: "k", version: version, size: 1, metadata: meta, contentTag: "\"e\""), at)
        }
        try a.index.claim([put("\"e\"~1", 10_000), put("\"e\"~2", 30_000)])
        #expect(try a.index.claims(["k"])[KeyBytes("k")]?.info.version == "\"e\"~2")
        try a.index.claim([put("\"e\"~3", 31_500)])
        #expect(try a.index.claims(["k"]).isEmpty)
        try a.index.claim([put("\"e\"~4", 40_000), ("k", nil, nil)])
        #expect(try a.index.claims(["k"]).isEmpty)
    }

    /// This device's own puts, as its log entries say, are told by its next full listing without
    /// a HEAD, when the listing bears them out and they are settled: 3,000 files uploaded were
    /// 3,000 HEADs there. Another tool's object is asked for; an entry is used once.
    @Test func aFullListingTakesThisDevicesOwnPutsFromItsLog() async throws {
        let (a, clean) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { clean() }
        let cursor = try await a.currentCursor()
        var made: [ObjectInfo] = []
        for i in 0 ..< 5 {
            made.append(try await a.put("mine/f\(i)", contentsOf: try tempFile([UInt8(i)]), metadata: meta, condition: .ifAbsent))
        }
        try await a.publishChanges()
        #expect(try a.index.claims(made.map(\.key)).count == 5)
        try await a.objects.client.send(.PUT, key: a.objects.prefix + "mine/other", body: .data(Data("x".utf8)))
        let full = try await fullListingTells(a, since: cursor, made)
        let other = try #require(full.changes.first { $0.key == "mine/other" })
        #expect(other.current == nil && other.version == nil, "\(other)")
        #expect(try a.index.claims(made.map(\.key)).isEmpty)
    }

    /// Files added at the end of a folder of more than a page (a folder being moved, a poll
    /// at a time): the listing starts just before the first of them, one request.
    @Test func aListingStartsWhereTheChangesAre() async throws {
        let (b, clean) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400)
        defer { clean() }
        let cursor = try await b.currentCursor()
        // Another tool's objects: more than a page of them before the ones the entries name.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for w in 0 ..< 8 {
                group.addTask {
                    for i in stride(from: w, to: 1_050, by: 8) {
                        let key = String(format: "big/a%04d", i)
                        try await b.objects.client.send(.PUT, key: b.objects.prefix + key, body: .data(Data("\(i)".utf8)))
                    }
                }
            }
            try await group.waitForAll()
        }
        var lines: [String] = []
        var wanted: [String: ObjectInfo] = [:]
        let now = b.log.serverNow()
        for i in 0 ..< 20 {
            let key = String(format: "big/z%02d", i)
            try await b.objects.client.send(.PUT, key: b.objects.prefix + key, body: .data(Data("new \(i)".utf8)))
            let o = try await b.head(key)
            let wrote = ObjectInfo(key: key, version: o.version, size: o.size, metadata: meta, contentTag: o.contentTag)
            wanted[key] = wrote
            lines.append(String(decoding: try JSONEncoder().encode(ChangeLog.Entry(op: "put", key: key, version: o.version,
                                                                                     wrote: wrote, at: now)), as: UTF8.self))
        }
        try await putLog(b, "\(ChangeLog.timeText(now))-other-1", lines.joined(separator: "\n"))
        let (changes, _) = try await look(b, from: cursor)
        let told = await b.confirmed(changes)
        #expect(b.lastLook.requests == 3, "a LIST of the log, its GET, one LIST of big/ from z00: \(b.lastLook)")
        #expect(told.count == 20 && told.allSatisfy { $0.current == .object(wanted[$0.key]!) }, "\(told.filter { $0.current == nil }.map(\.key))")
    }

    /// What a listing does not bear out is left to a HEAD: an entry whose ETag or size is not
    /// what the folder holds, one written well before the object the listing shows (a later
    /// write of the same bytes), a put that says nothing of what it wrote, a key changed twice,
    /// and a delete of a key that is there. A delete of a key that is not there is told.
    @Test func anEntryTheListingDoesNotBearOutIsAskedFor() async throws {
        let (b, clean) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400)
        defer { clean() }
        let cursor = try await b.currentCursor()
        // Another tool's objects (no entries of their own): the entries below are made by hand.
        var listed: [String: ObjectInfo] = [:]
        for i in 0 ..< 16 {
            let key = "f/k\(i)"
            try await b.objects.client.send(.PUT, key: b.objects.prefix + key, body: .data(Data("bytes \(i)".utf8)))
            listed[key] = try await b.head(key)
        }
        let now = b.log.serverNow()
        let encoder = JSONEncoder()
        func entry(_ key: String, tag: String? = nil, size: Int64? = nil, at: Int64? = nil) throws -> String {
            let o = listed[key]!
            let e = ChangeLog.Entry(op: "put", key: key, version: o.version,
                                      wrote: ObjectInfo(key: key, version: o.version, size: size ?? o.size, metadata: meta,
                                                        contentTag: tag ?? o.contentTag),
                                      at: at ?? now)
            return String(decoding: try encoder.encode(e), as: UTF8.self)
        }
        var lines = try (0 ..< 10).map { try entry("f/k\($0)") }
        lines.append(try entry("f/k10", tag: "\"00000000000000000000000000000000\""))
        lines.append(try entry("f/k11", size: 99))
        // Written a minute before the object the listing shows (reckoned from the object's own
        // time: from now, a slow run made the object itself a minute old, and the entry held).
        let k12 = try await b.objects.listAll(under: "f/").objects.first { $0.key == "f/k12" }?.modified ?? Date()
        lines.append(try entry("f/k12", at: Int64(k12.timeIntervalSince1970 * 1000) - 60_000))
        lines.append(#"{"op":"put","key":"f/k13","version":"v"}"#)
        lines.append(try entry("f/k14"))
        lines.append(#"{"op":"delete","key":"f/k14"}"#)
        lines.append(#"{"op":"delete","key":"f/k15"}"#)
        lines.append(#"{"op":"delete","key":"f/gone"}"#)
        try await putLog(b, "\(ChangeLog.timeText(now))-other-1", lines.joined(separator: "\n"))
        let (changes, _) = try await look(b, from: cursor)
        let told = await b.confirmed(changes)
        #expect(b.lastLook.requests == 3, "a LIST of the log, its GET, a LIST of f/: \(b.lastLook)")
        var current: [String: StoreChange.Current?] = [:]
        for c in told { current[c.key] = current[c.key] == nil ? c.current : .some(nil) }
        for i in 0 ..< 10 { #expect(current["f/k\(i)"] == .object(ObjectInfo(key: "f/k\(i)", version: listed["f/k\(i)"]!.version, size: listed["f/k\(i)"]!.size, metadata: meta, contentTag: listed["f/k\(i)"]!.contentTag))) }
        for k in ["f/k10", "f/k11", "f/k12", "f/k13", "f/k14", "f/k15"] { #expect(current[k] == .some(nil), "\(k): \(String(describing: current[k]))") }
        #expect(current["f/gone"] == .absent)
    }
}
