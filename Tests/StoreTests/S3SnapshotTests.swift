import Foundation
import Logging
import Testing
import TestSupport
@testable import UbiqStore
@testable import UbiqS3

/// Snapshots of the bucket (S3Snapshots), on a real SeaweedFS: a new device learns what the
/// objects are from the latest snapshot rather than a HEAD each; what a snapshot holds cannot
/// hurt a reader; old snapshots go.
@Suite struct S3SnapshotTests {
    func putRaw(_ store: S3Store, _ key: String, _ body: String) async throws {
        try await store.objects.client.send(.PUT, key: store.objects.prefix + key, body: .data(Data(body.utf8)))
    }

    /// A snapshot's part as a device with the bucket's key writes it (`BucketSeal`), whatever it holds.
    func putSealedPart(_ store: S3Store, snapshot name: String, _ part: String, _ body: String) async throws {
        let sealed = store.snapshots.seal.sealed(Data(body.utf8), name: name + "/" + part)
        try await store.objects.client.send(.PUT, key: store.objects.prefix + S3Snapshots.folder + name + "/" + part, body: .data(sealed))
    }

    /// Device A's first full listing finds no snapshot and writes one; a new device B then
    /// lists the bucket with a HEAD only for what came after (A's later file, another tool's),
    /// and learns the same metadata a HEAD gives. B writes none while A's is recent, and
    /// writes one when its own listing needed many HEADs.
    @Test func aNewDeviceLearnsTheBucketFromASnapshot() async throws {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanA() }
        var m = fileMeta
        for i in 0 ..< 30 {
            m.mtimeNs = 1_700_000_000_000_000_000 + Int64(i)
            m.xattrs = i % 3 == 0 ? ["user.n": Data("\(i)".utf8)] : [:]
            _ = try await a.put("d\(i % 4)/f\(i)", contentsOf: try tempFile([UInt8(i)]), metadata: m, condition: .ifAbsent)
        }
        _ = try await a.put("e/", contentsOf: nil, metadata: ObjectMetadata(kind: .directory, mode: 0o750), condition: .ifAbsent)
        _ = try await a.currentCursor()
        let written = try await a.snapshots.all()
        #expect(written.count == 1 && written.first?.complete == true && written.first?.parts == ["00000"], "\(written)")

        _ = try await a.put("late", contentsOf: try tempFile([7]), metadata: fileMeta, condition: .ifAbsent)
        try await putRaw(a, "foreign.txt", "f")
        let (b, cleanB) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanB() }
        b.logObjectsReadAtAMountAgain = 0  // (the snapshot alone: not the log since it, which tells "late")
        let seen = try await b.list(prefix: "")
        #expect(seen.count == 33 && b.headsForLastListing == 2, "\(seen.count) objects, \(b.headsForLastListing) HEADs")
        let heads = try await a.list(prefix: "")  // A's index: what HEADs said
        #expect(seen == heads)
        #expect(seen.first { $0.key == "d3/f3" }?.metadata.xattrs == ["user.n": Data("3".utf8)])

        // A's snapshot is recent: B's full listing writes none. Told that two HEADs are many,
        // it writes one at its next.
        _ = try await b.currentCursor()
        #expect(try await b.snapshots.all().count == 1)
        let (c, cleanC) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanC() }
        c.headsWorthASnapshot = 2
        c.logObjectsReadAtAMountAgain = 0
        c.describePage = 4  // its listing looked up four objects at a time: the same answer
        c.snapshots.entriesPerPart = 5  // and its snapshot goes up in parts as they fill
        #expect(try await c.list(prefix: "") == heads)
        #expect(c.headsForLastListing == 2)
        // A snapshot is named by its listing's second: C's comes after A's (of two in one
        // second, a reader takes either; the older costs it HEADs, never a wrong file).
        try await Task.sleep(for: .seconds(1.1))
        _ = try await c.currentCursor()
        let now = try await c.snapshots.all()
        #expect(now.count == 2 && now.allSatisfy(\.complete), "\(now)")
        #expect(now.last?.parts.count == 7, "33 objects in parts of 5: \(now)")
        // A device that comes next needs no HEAD at all, another tool's object included.
        let (d, cleanD) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanD() }
        #expect(try await d.list(prefix: "") == heads && d.headsForLastListing == 0)

        // A device whose listing needed many HEADs and that stops before its next full listing
        // writes the snapshot at its first full listing after it starts again.
        for k in ["g1", "g2", "g3"] { try await putRaw(a, k, k) }
        let index = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3index-\(UUID().uuidString).db").path
        let (e, _) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, index: index, settleWindow: 0)
        e.headsWorthASnapshot = 2
        #expect(try await e.list(prefix: "").count == 36 && e.headsForLastListing == 3)
        let before = Set(try await e.snapshots.all().map(\.name))
        let (again, cleanAgain) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, index: index, settleWindow: 0)
        defer { cleanAgain() }
        _ = try await again.currentCursor()
        let after = try await again.snapshots.all()
        #expect(after.contains { !before.contains($0.name) && $0.complete }, "no snapshot written after the restart: \(after)")
    }

    /// A bucket filled through one device: its own puts need no HEAD there, so no listing
    /// of its wished for a snapshot, and the one of the bucket before (empty) stayed for a
    /// day, each new device sending a HEAD per object. Now a new device reads the log since
    /// the latest snapshot, and a full listing that finds as many objects written since the
    /// latest snapshot as a listing's HEADs that wish for one writes one; a device that knew an
    /// older snapshot looks for a newer one first (one LIST), so of devices that all see the
    /// bucket grow, not every one writes it.
    @Test func aBucketFilledThroughOneDeviceGetsASnapshotForTheNext() async throws {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanA() }
        a.headsWorthASnapshot = 10
        _ = try await a.currentCursor()  // the empty bucket's snapshot
        let first = try await a.snapshots.latest()?.name
        #expect(first != nil)
        for i in 0 ..< 6 { _ = try await a.put("d/f\(i)", contentsOf: try tempFile([UInt8(i)]), metadata: fileMeta, condition: .ifAbsent) }
        _ = try await a.currentCursor()
        #expect(try await a.snapshots.latest()?.name == first, "six objects written since are not ten")
        // A new device meanwhile reads the log since that snapshot: no HEAD for them either.
        try await a.publishChanges()
        let (x, cleanX) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanX() }
        _ = try await x.startingCursor(listingFirst: 100_000)
        #expect(try await x.list(prefix: "") == a.list(prefix: "") && x.headsForLastListing == 0, "\(x.headsForLastListing) HEADs")
        for i in 6 ..< 20 { _ = try await a.put("d/f\(i)", contentsOf: try tempFile([UInt8(i)]), metadata: fileMeta, condition: .ifAbsent) }
        try await a.publishChanges()
        // (A snapshot may lack what was written in the second before it, by the server's clock
        // (the settle window is 0 here): past that, B's count below leaves these out; and B reads
        // the log from 3 s before it: this log object is older, and in the window still.)
        try await Task.sleep(for: .seconds(5.5))
        _ = try await a.currentCursor()
        let second = try await a.snapshots.latest()?.name
        #expect(second != first)

        // A new device needs no HEAD; it knows the latest snapshot and writes none. The log
        // objects from before the snapshot, in the window still, are marked read: its first
        // look reads none of them (one LIST).
        try await a.publishChanges()
        let (b, cleanB) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanB() }
        b.headsWorthASnapshot = 10
        let bStart = try await b.startingCursor(listingFirst: 100_000)
        #expect(try await b.list(prefix: "").count == 20 && b.headsForLastListing == 0, "\(b.headsForLastListing) HEADs")
        let look = try await b.changes(since: bStart, limit: 1000)
        #expect(look.changes.isEmpty && b.lastLook == (1, false), "\(look.changes.map(\.key)) \(b.lastLook)")
        _ = try await b.currentCursor()
        #expect(try await a.snapshots.latest()?.name == second)

        // Both see twelve more objects; A writes a snapshot of them first, and B, which knew
        // the one before, finds A's and writes none.
        for i in 20 ..< 32 { _ = try await a.put("e/f\(i)", contentsOf: try tempFile([UInt8(i)]), metadata: fileMeta, condition: .ifAbsent) }
        // (What is written in the second before a snapshot's listing, by the server's whole
        // seconds, counts as written since it: these twelve must be older than that for B.)
        try await Task.sleep(for: .seconds(2.2))
        _ = try await a.currentCursor()
        let third = try await a.snapshots.latest()?.name
        #expect(third != second)
        _ = try await b.currentCursor()
        #expect(try await a.snapshots.latest()?.name == third, "a second device wrote the same snapshot again")
    }

    /// A device that never read a snapshot reads the latest while its first full listing
    /// lists, once the first page says there is more than a page (its mount waited for the two
    /// one after the other); a bucket of one page is not asked for snapshots then.
    @Test func aNewDeviceReadsTheSnapshotWhileItLists() async throws {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanA() }
        for i in 0 ..< 6 { _ = try await a.put("f\(i)", contentsOf: try tempFile([UInt8(i)]), metadata: fileMeta, condition: .ifAbsent) }
        _ = try await a.currentCursor()
        let written = try #require(try await a.snapshots.latest())
        let heads = try await a.list(prefix: "")
        for (pageSize, readWhileListing) in [(2, true), (1000, false)] {
            let (b, cleanB) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
            defer { cleanB() }
            b.listingPageSize = pageSize
            _ = try await b.currentCursor()
            #expect(try b.index.setting("snapshot") == (readWhileListing ? written.name : nil), "pages of \(pageSize)")
            #expect(try await b.list(prefix: "") == heads && b.headsForLastListing == 0, "pages of \(pageSize)")
        }
    }

    /// A device new to the bucket (`startingCursor(listingFirst:)`) lists its first part
    /// only, and reads only the snapshot's parts that part needs (parts hold keys in order);
    /// the `list` that takes that part hands it on and says it was only that. Its next listing
    /// of the whole bucket reads the snapshot's other parts and needs no HEAD; the feed's first
    /// full listing, the same one, tells nothing of the keys past the part (the importer took
    /// them from it), and of the part what changed since. A first part is no full listing: a
    /// device that finds no snapshot writes none of it.
    @Test func aNewDeviceListsItsFirstPartAndReadsOnlyTheSnapshotsPartsForIt() async throws {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanA() }
        for i in 0 ..< 60 {
            _ = try await a.put(String(format: "d%d/f%02d", i % 3, i), contentsOf: try tempFile([UInt8(i)]), metadata: fileMeta,
                                condition: .ifAbsent)
        }
        // No snapshot yet: a new device's first part writes none.
        let (b0, cleanB0) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanB0() }
        b0.listingPageSize = 5
        _ = try await b0.startingCursor(listingFirst: 20)
        #expect(try await b0.snapshots.all().isEmpty)
        a.snapshots.entriesPerPart = 10
        _ = try await a.currentCursor()
        let written = try #require(try await a.snapshots.latest())
        #expect(written.parts.count == 6)
        let heads = try await a.list(prefix: "")

        let (b, cleanB) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanB() }
        b.listingPageSize = 5
        let cursor = try await b.startingCursor(listingFirst: 20)
        var first: [ObjectInfo] = []
        await #expect(throws: ListingCutShort.self) {
            try await b.list(prefix: "", pagesOf: 10, wanted: { $0.map { _ in true } }) { first += $0 }
        }
        // At least 20 (a page the server makes longer is taken whole).
        #expect(first.count >= 20 && first.count < 60 && first == Array(heads.prefix(first.count)), "\(first.map(\.key))")
        #expect(b.headsForLastListing == 0)
        // Parts of 10 in key order: the first part's keys are in the snapshot's first few.
        #expect(try b.index.setting(S3Store.snapshotPartSetting) == "\(written.name) \((first.count - 1) / 10 + 1)")
        #expect(try b.index.setting("snapshot") == nil)
        #expect(try await b.snapshots.all().count == 1)

        // One key of the part changes meanwhile (another tool's write).
        try await a.objects.client.send(.PUT, key: a.objects.prefix + "d0/f00", body: .data(Data("changed".utf8)))
        let whole = try await b.list(prefix: "")
        #expect(whole.count == 60 && b.headsForLastListing == 1, "\(whole.count) objects, \(b.headsForLastListing) HEADs")
        #expect(try b.index.setting("snapshot") == written.name)
        let batch = try await b.changes(since: cursor, limit: 1000)
        #expect(!batch.reset)
        #expect(batch.changes.map(\.key) == ["d0/f00"], "\(batch.changes.map(\.key))")
    }

    /// A snapshot is written by anyone who can write to the bucket. Lines that are not
    /// entries, keys that are not names or are the store's own, an entry whose version is not
    /// the object its stamp names, one for an object that is not there, metadata out of range:
    /// each costs at most a HEAD or is read as a HEAD's would be; a newer format, or one
    /// without its `done`, is passed over whole.
    @Test func whatASnapshotHoldsCannotHurtAReader() async throws {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanA() }
        for k in ["x", "y", "w"] { _ = try await a.put(k, contentsOf: try tempFile([1]), metadata: fileMeta, condition: .ifAbsent) }
        try await putRaw(a, "raw", "r")  // another tool's
        let listing = try await a.objects.listAll(under: "")
        let stamp = Dictionary(uniqueKeysWithValues: listing.objects.map { ($0.key, $0.stamp) })
        let x = try await a.head("x"), y = try await a.head("y"), raw = try await a.head("raw")
        func entry(_ key: String, stamp: String, version: String, tag: String?, meta: String, foreign: Bool = false) -> String {
            let q = { (s: String) in String(data: try! JSONEncoder().encode(s), encoding: .utf8)! }
            return #"{"key":\#(q(key)),"stamp":\#(q(stamp)),"version":\#(q(version)),"size":1,"tag":\#(tag.map(q) ?? "null"),"meta":\#(meta)"#
                + (foreign ? #","foreign":true}"# : "}")
        }
        let good = #"{"kind":"file","mode":416,"uid":1000,"gid":1000,"mtimeNs":5,"rdev":0,"xattrs":{}}"#
        let lines = [
            entry("x", stamp: stamp["x"]!, version: x.version, tag: x.contentTag, meta: good),
            "not json",
            entry("y", stamp: stamp["y"]!, version: "\"0000\"", tag: "\"0000\"", meta: good),  // not y's version
            entry("w", stamp: stamp["w"]!, version: y.version, tag: y.contentTag, meta: #"{"kind":"whiteout","mode":-5}"#),
            entry("../etc/passwd", stamp: stamp["x"]!, version: x.version, tag: x.contentTag, meta: good),
            entry(".ubiquity/s3/meta/z", stamp: stamp["x"]!, version: x.version, tag: x.contentTag, meta: good),
            entry("ghost", stamp: stamp["x"]!, version: x.version, tag: x.contentTag, meta: good),
            // Another tool's object is the reader's user's, whoever wrote the snapshot.
            entry("raw", stamp: stamp["raw"]!, version: raw.version, tag: raw.contentTag,
                  meta: #"{"kind":"file","mode":420,"uid":4242,"gid":4242,"mtimeNs":5,"rdev":0,"xattrs":{}}"#, foreign: true),
        ]
        let now = a.log.serverNow()
        func put(_ name: String, _ object: String, _ body: String) async throws {
            // Written by a device with the bucket's key (a buggy or newer one): what it holds is
            // checked all the same.
            if object == "done" { try await putRaw(a, S3Snapshots.folder + name + "/" + object, body) } else {
                try await putSealedPart(a, snapshot: name, object, body)
            }
        }
        let name = ChangeLog.name(time: now - 2000, device: "other")
        try await put(name, "00000", lines.joined(separator: "\n"))
        try await put(name, "done", #"{"format":1,"parts":1,"entries":8}"#)
        // Later ones a reader must not take: a newer format, and one still being written.
        let newer = ChangeLog.name(time: now - 1000, device: "newer")
        try await put(newer, "00000", entry("y", stamp: stamp["y"]!, version: "\"1\"", tag: "\"1\"", meta: good))
        try await put(newer, "done", #"{"format":2,"parts":1,"entries":1}"#)
        try await put(ChangeLog.name(time: now, device: "busy"), "00000", entry("y", stamp: stamp["y"]!, version: "\"2\"", tag: "\"2\"", meta: good))

        let (b, cleanB) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanB() }
        b.logObjectsReadAtAMountAgain = 0  // (the snapshots alone, not A's log since them)
        // The latest complete one is of a newer format: passed over whole, every object a HEAD.
        var seen = try await b.list(prefix: "")
        let heads = try await a.list(prefix: "")
        #expect(b.headsForLastListing == 4 && seen == heads)
        // Without it, the hostile one: x from it, y (wrong version) a HEAD, w read leniently.
        for o in ["done", "00000"] { try await a.objects.send(.DELETE, S3Snapshots.folder + newer + "/" + o, validate: false) }
        let (c, cleanC) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanC() }
        c.logObjectsReadAtAMountAgain = 0
        seen = try await c.list(prefix: "")
        #expect(c.headsForLastListing == 1, "\(c.headsForLastListing) HEADs")
        #expect(seen.map(\.key) == ["raw", "w", "x", "y"])
        #expect(seen.first { $0.key == "raw" }.map { [$0.metadata.uid, $0.metadata.gid] } == [getuid(), getgid()])
        #expect(seen.first { $0.key == "x" }?.metadata.mtimeNs == 5)
        #expect(seen.first { $0.key == "y" } == y)
        let w = seen.first { $0.key == "w" }
        #expect(w?.metadata.kind == .file && w?.metadata.mode == 0o644, "\(String(describing: w))")
        // The ghost's entry is known until a full listing shows there is no such object.
        let ghost = ListedObject(key: "ghost", etag: try #require(listing.objects.first { $0.key == "x" }).etag,
                                 size: 1, modified: listing.objects.first { $0.key == "x" }?.modified)
        let before = try c.index.known([ghost])
        #expect(ghost.stamp == stamp["x"] && before.count == 1)
        _ = try await c.currentCursor()
        #expect(try c.index.known([ghost]).isEmpty)
        let said = try await c.snapshots.load(try #require(try await c.snapshots.latest()), into: c.index).unreadable.lines
        #expect(said.count == 5 && said.contains { $0.contains("\"w\"'s metadata read with defaults (kind \"whiteout\" unknown, mode unreadable)") },
                "\(said)")
    }

    /// A part of nothing but bad lines is counted, and only the first few are kept to be said:
    /// memory does not grow with what a hostile writer puts there.
    @Test func aFloodOfBadLinesIsCounted() async throws {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanA() }
        let name = ChangeLog.name(time: a.log.serverNow(), device: "flood")
        try await putSealedPart(a, snapshot: name, "00000", String(repeating: "x\n", count: 50_000))
        try await putRaw(a, S3Snapshots.folder + name + "/done", #"{"format":1,"parts":1,"entries":50000}"#)
        let loaded = try await a.snapshots.load(try #require(try await a.snapshots.latest()), into: a.index)
        #expect(loaded.unreadable.count == 50_000 && loaded.unreadable.said.count == PassedOver.kept && loaded.entries == 0)
        #expect(loaded.unreadable.lines.last == "… and \(50_000 - PassedOver.kept) more like these")
    }

    /// A part a busy server answers with an empty body (SeaweedFS did, with headers that agreed)
    /// is asked for again, by its size in the listing: its entries are read, not passed over.
    @Test func aPartABusyServerAnswersEmptyIsAskedAgain() async throws {
        let entry = S3Snapshots.Entry(key: "x", stamp: "\"abc\"|1700000000000|1", version: "\"abc\"", size: 1, tag: "\"abc\"", meta: fileMeta)
        let name = "1796000000000-dev-1"
        let seal = BucketSeal(secret: "s", bucket: "b", prefix: "drive/")
        let part = seal.sealed(try JSONEncoder().encode(entry) + Data("\n".utf8), name: name + "/00000")
        let done = try JSONEncoder().encode(S3Snapshots.Done(format: S3Snapshots.format, parts: 1, entries: 1))
        let server = try ScriptedHTTPServer([.init(200, body: done), .init(200, body: Data()), .init(200, body: part)])
        defer { server.stop() }
        let client = S3Client(endpoint: S3Endpoint(url: server.endpoint, region: "us-east-1", bucket: "b",
                                                   credentials: S3Credentials(accessKey: "k", secretKey: "s")),
                              logger: Logger(label: "s3-test"), attempts: 4)
        let snapshots = S3Snapshots(objects: S3Objects(client: client, prefix: "drive", versioned: false))
        let found = S3Snapshots.Found(name: name, time: 1_796_000_000_000, parts: ["00000"], complete: true,
                                      sizes: ["done": done.count, "00000": part.count])
        let index = try S3Index(path: TempPaths.make("ubiq-s3-index").path)
        let loaded = try await snapshots.load(found, into: index)
        #expect(loaded.entries == 1, "\(loaded)")
        #expect(loaded.unreadable.lines.isEmpty, "\(loaded.unreadable.lines)")
        #expect(server.requests.count == 3)
    }

    /// A done object that is not one (another client's, a hostile one) is asked for once more,
    /// then said with what it held, and the snapshot gives nothing: the listing covers it.
    @Test func aDoneObjectThatIsNotOneIsSaid() async throws {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanA() }
        let name = ChangeLog.name(time: a.log.serverNow(), device: "odd")
        try await putRaw(a, S3Snapshots.folder + name + "/00000", #"{"key":"x"}"# + "\n")
        try await putRaw(a, S3Snapshots.folder + name + "/done", "<done/>")
        let loaded = try await a.snapshots.load(try #require(try await a.snapshots.latest()), into: a.index)
        #expect(loaded.entries == 0 && loaded.requests == 2)
        #expect(loaded.unreadable.lines == ["snapshot \(name): its done object is not one (HTTP 206, 7 bytes: \"<done/>\")"],
                "\(loaded.unreadable.lines)")
    }

    /// A snapshot forged by a writer without the bucket's key (an entry for every object at its
    /// true ETag, time and size, with mode 0777, uid 0, an xattr and a wrong digest) changes
    /// nothing a new device shows or reads: one named for a time to come is not even looked
    /// at; one named for now is read, found unsealed, and passed over for the real one before
    /// it (which is then taken), and then for good. (Every new device showed the forged
    /// metadata, and every read failed its digest, also after a full listing.)
    @Test func aForgedSnapshotChangesNothingADeviceShows() async throws {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanA() }
        var meta = fileMeta
        meta.xattrs = ["user.kept": Data("yes".utf8)]
        for k in ["x", "y"] { _ = try await a.put(k, contentsOf: try tempFile([1, 2]), metadata: meta, condition: .ifAbsent) }
        // The real snapshot, by A.
        let listing = try await a.objects.listAll(under: "")
        let heads = try await a.list(prefix: "")
        let real = try await a.snapshots.write(zip(listing.objects, heads).map { ($0, $1) }, time: a.log.serverNow() - 5000, device: "a")
        func forged(_ name: String) async throws {
            var lines: [String] = []
            for (o, h) in zip(listing.objects, heads) {
                var bad = h.metadata
                bad.mode = 0o777; bad.uid = 0; bad.xattrs = ["user.evil": Data("x".utf8)]
                bad.sha256 = String(repeating: "0", count: 64)
                let e = S3Snapshots.Entry(key: o.key, stamp: o.stamp, version: h.version, size: h.size, tag: h.contentTag, meta: bad)
                lines.append(String(decoding: try JSONEncoder().encode(e), as: UTF8.self))
            }
            try await putRaw(a, S3Snapshots.folder + name + "/00000", lines.joined(separator: "\n") + "\n")
            try await putRaw(a, S3Snapshots.folder + name + "/done", #"{"format":1,"parts":1,"entries":2}"#)
        }
        let future = ChangeLog.name(time: 9_999_999_999_000, device: "evil")
        let now = ChangeLog.name(time: a.log.serverNow(), device: "evil")
        try await forged(future)
        try await forged(now)
        let (b, cleanB) = try await SeaweedFS.shared().store(of: a.objects.client.endpoint.bucket, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanB() }
        b.logObjectsReadAtAMountAgain = 0
        #expect(try await b.snapshots.latest()?.name == now, "the one named for a time to come was taken")
        let seen = try await b.list(prefix: "")
        #expect(seen == heads, "\(seen)")
        #expect(seen.allSatisfy { $0.metadata.mode == fileMeta.mode && $0.metadata.xattrs["user.evil"] == nil })
        #expect(b.headsForLastListing == 0, "the real snapshot was not taken: \(b.headsForLastListing) HEADs")
        #expect(try b.index.setting("snapshot") == real.name)
        #expect(try await b.snapshots.latest()?.name == real.name)
    }

    /// Old snapshots go when one is written: the latest two complete ones stay, with one
    /// still being written; one abandoned a day ago goes. Two devices writing at once write
    /// two whole snapshots.
    @Test func oldSnapshotsGo() async throws {
        let (a, cleanA) = try await SeaweedFS.shared().newStore(versioned: false, fullListingInterval: 86_400, settleWindow: 0)
        defer { cleanA() }
        let now = a.log.serverNow()
        let hour: Int64 = 3_600_000
        for t in [now - 3 * hour, now - 2 * hour, now - hour] { _ = try await a.snapshots.write([], time: t, device: "a") }
        let abandoned = try await a.snapshots.write([], time: now - 25 * hour, device: "crashed")
        try await a.objects.send(.DELETE, S3Snapshots.folder + abandoned.name + "/done", validate: false)
        let busy = try await a.snapshots.write([], time: now, device: "busy")
        try await a.objects.send(.DELETE, S3Snapshots.folder + busy.name + "/done", validate: false)
        async let one = a.snapshots.write([], time: now, device: "one")
        async let two = a.snapshots.write([], time: now, device: "two")
        let both = try await [one, two]
        try await a.snapshots.prune(now: now)
        let left = try await a.snapshots.all()
        #expect(Set(left.map(\.name)) == Set(both.map(\.name) + [busy.name]), "\(left.map(\.name))")
        #expect(try await a.snapshots.latest().map { both.map(\.name).contains($0.name) } == true)
    }
}
