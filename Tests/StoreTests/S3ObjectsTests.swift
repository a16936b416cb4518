import Foundation
import Logging
import Testing
import TestSupport
import UbiqStore
@testable import UbiqS3

/// The object operations of the S3 store on a real SeaweedFS, in a bucket without
/// versioning and in one with it.
/// Times a server sends (another device, a newer client or a malicious one may send anything)
/// past what the fields hold: no date, or one held at the end of nanoseconds, never a trap (a
/// year past Int32 trapped as a field of `tm`, a Last-Modified of 9999 as nanoseconds).
@Test func aServersTimesPastWhatTheyHoldAreNoTrap() {
    #expect(S3Time.httpDate("Mon, 23 Nov 2026 22:30:15 GMT") == Date(timeIntervalSince1970: 1_795_473_015))
    for bad in ["Mon, 23 Nov 99999999999 22:30:15 GMT", "Mon, 99999999999 Nov 2026 22:30:15 GMT",
                "Mon, 23 Nov 2026 99999999999:30:15 GMT", "Mon, 23 Nov 2026 22:-1:15 GMT", "Mon, 0 Nov 2026 22:30:15 GMT"] {
        #expect(S3Time.httpDate(bad) == nil, "\(bad)")
    }
    let far = S3Time.httpDate("Fri, 31 Dec 9999 23:59:59 GMT")
    #expect(far != nil)
    #expect(S3Objects.foreign("x", modified: far).mtimeNs == Int64.max)
    #expect(S3Objects.foreign("x", modified: Date(timeIntervalSince1970: 1)).mtimeNs == 1_000_000_000)
    #expect(nanoseconds(sinceEpoch: -1e300) == Int64.min && nanoseconds(sinceEpoch: .nan) == 0)
}

/// Bytes of another version are refused: a server that ignores `If-Match` on a GET, or a
/// proxy's stale copy, answers with another ETag (or version id), and the read fails as "that
/// version is gone" instead of mixing those bytes into a file.
@Test func anAnswerNamingAnotherVersionIsRefused() {
    let plain = S3Objects.Version("\"abc\"~0123456789ab")
    #expect(S3Objects.serves(plain, etag: "\"abc\"", versionID: nil))
    #expect(S3Objects.serves(plain, etag: "abc", versionID: nil))
    #expect(!S3Objects.serves(plain, etag: "\"def\"", versionID: nil))
    let versioned = S3Objects.Version("v1 \"abc\"")
    #expect(S3Objects.serves(versioned, etag: "\"abc\"", versionID: "v1"))
    #expect(!S3Objects.serves(versioned, etag: "\"abc\"", versionID: "v2"))
    #expect(S3Objects.serves(versioned, etag: nil, versionID: nil))  // a server that says nothing is taken at its word
}

/// The S3 objects of bucket "b" under "drive/" on a scripted server.
func scriptedObjects(_ server: ScriptedHTTPServer) -> S3Objects {
    S3Objects(client: S3Client(endpoint: S3Endpoint(url: server.endpoint, region: "us-east-1", bucket: "b",
                                                    credentials: S3Credentials(accessKey: "k", secretKey: "s")),
                               logger: Logger(label: "s3-test")), prefix: "drive", versioned: false)
}

/// A ranged read answered with fewer bytes than asked, where the version's size says there are
/// more, is asked again (SeaweedFS under load answered 200 with no bytes, its headers agreeing:
/// a read into a file came back with nothing written); one that ends where the object ends, as
/// its own `Content-Range` says, is the read, without a HEAD. One that stays short is
/// `unavailable`, the store's transient failure.
@Test func aShortAnswerInsideTheObjectIsAskedAgain() async throws {
    let bytes = Data((0 ..< 100).map { UInt8($0) })
    let head = ScriptedHTTPServer.Answer(200, headers: [("ETag", "\"abc\"")], claimedLength: 100)
    let empty = ScriptedHTTPServer.Answer(200, headers: [("ETag", "\"abc\"")])
    let busy = try ScriptedHTTPServer([empty, head, .init(206, headers: [("Content-Range", "bytes 10-19/100"), ("ETag", "\"abc\"")], body: bytes[10 ..< 20])])
    defer { busy.stop() }
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3-short-\(UUID().uuidString)").path
    defer { unlink(path) }
    let fd = open(path, O_RDWR | O_CREAT, 0o600)
    defer { close(fd) }
    #expect(try await scriptedObjects(busy).read("k", version: "\"abc\"", range: 10 ..< 20, into: fd, at: 0) == 10)
    #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == bytes[10 ..< 20])
    #expect(busy.requests.count == 3)

    let end = try ScriptedHTTPServer([.init(206, headers: [("Content-Range", "bytes 90-99/100"), ("ETag", "\"abc\"")], body: bytes[90...])])
    defer { end.stop() }
    #expect(try await scriptedObjects(end).read("k", version: "\"abc\"", range: 90 ..< 200) == bytes[90...])
    #expect(end.requests.count == 1)

    let stubborn = try ScriptedHTTPServer(Array(repeating: [empty, head], count: S3Objects.rangeRetries.tries!).flatMap { $0 })
    defer { stubborn.stop() }
    do {
        _ = try await scriptedObjects(stubborn).read("k", version: "\"abc\"", range: 10 ..< 20)
        Issue.record("an empty answer was read as the range")
    } catch let e as StoreError {
        #expect(e.isTransient && "\(e)".contains("answered 0 of bytes 10-19 of a version of 100 bytes"), "\(e)")
    }
}

/// Metadata too large for a header is in a sidecar object named by its bytes' SHA-256: an
/// answer that does not hash to its name (a busy server's empty body) is asked for again;
/// a sidecar that stays wrong (rewritten by someone) is read as metadata that cannot be read,
/// never as what it says.
@Test func aSidecarThatDoesNotHashToItsNameIsAskedAgain() async throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = .sortedKeys
    var meta = fileMeta
    meta.xattrs["user.big"] = Data(repeating: 7, count: 3000)
    let json = try encoder.encode(meta)
    let ref = "ref:" + SigV4.sha256Hex(json)
    let busy = try ScriptedHTTPServer([.init(200, body: Data()), .init(200, body: json)])
    defer { busy.stop() }
    #expect(try await scriptedObjects(busy).decode(ref, of: "k") == meta)
    #expect(busy.requests.count == 2)

    var other = meta
    other.mode = 0o777
    let rewritten = try ScriptedHTTPServer(Array(repeating: .init(200, body: try encoder.encode(other)), count: 2))
    defer { rewritten.stop() }
    let read = try await scriptedObjects(rewritten).decode(ref, of: "k")
    #expect(read != other && read.issues.contains { $0.contains("does not hold what its name says") }, "\(read.issues)")
}

/// A "not satisfiable" that does not say the object's size is checked against the version's
/// own size (a HEAD): for a range that starts inside the object it is asked again, never read
/// as an empty range (SeaweedFS under load answered so, and the range read back empty); past
/// the end it is the empty range; a version gone meanwhile is `notFound`; an answer that
/// stays wrong is `unavailable`, the store's transient failure.
@Test func aNotSatisfiableThatContradictsTheVersionsSizeIsAskedAgain() async throws {
    let bytes = Data((0 ..< 100).map { UInt8($0) })
    let invalid = ScriptedHTTPServer.Answer(416, body: Data("<Error><Code>InvalidRange</Code></Error>".utf8))
    func head(_ etag: String) -> ScriptedHTTPServer.Answer { .init(200, headers: [("ETag", etag)], claimedLength: 100) }
    let inside = try ScriptedHTTPServer([invalid, head("\"abc\""),
                                         .init(206, headers: [("Content-Range", "bytes 90-99/100"), ("ETag", "\"abc\"")], body: bytes[90...])])
    defer { inside.stop() }
    #expect(try await scriptedObjects(inside).read("k", version: "\"abc\"", range: 90 ..< 200) == bytes[90...])
    #expect(inside.requests.count == 3)

    let past = try ScriptedHTTPServer([invalid, head("\"abc\"")])
    defer { past.stop() }
    #expect(try await scriptedObjects(past).read("k", version: "\"abc\"", range: 100 ..< 110).isEmpty)
    #expect(past.requests.count == 2)

    let gone = try ScriptedHTTPServer([invalid, head("\"def\"")])
    defer { gone.stop() }
    await #expect(throws: StoreError.notFound(key: "k")) { try await scriptedObjects(gone).read("k", version: "\"abc\"", range: 90 ..< 200) }

    let stubborn = try ScriptedHTTPServer(Array(repeating: [invalid, head("\"abc\"")], count: S3Objects.rangeRetries.tries!).flatMap { $0 })
    defer { stubborn.stop() }
    do {
        _ = try await scriptedObjects(stubborn).read("k", version: "\"abc\"", range: 90 ..< 200)
        Issue.record("a 416 inside the object was read as an empty range")
    } catch let e as StoreError {
        #expect(e.isTransient && "\(e)".contains("416 for bytes 90- of a version of 100 bytes"), "\(e)")
    }
    #expect(stubborn.requests.count == 2 * S3Objects.rangeRetries.tries!)
}

@Suite struct S3ObjectsTests {
    let meta = ObjectMetadata(kind: .file, mode: 0o640, uid: 1000, gid: 1000, mtimeNs: 1_700_000_000_123_456_789,
                              xattrs: ["user.color": Data("blue".utf8)])

    func objects(versioned: Bool) async throws -> S3Objects {
        let client = try await SeaweedFS.shared().newBucket(versioned ? "v" : "u")
        if versioned {
            let enable = "<VersioningConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Status>Enabled</Status></VersioningConfiguration>"
            try await client.send(.PUT, key: nil, query: [("versioning", "")], body: .data(Data(enable.utf8)))
        }
        #expect(try await client.bucketKeepsVersions() == versioned)
        return S3Objects(client: client, prefix: "drive", versioned: versioned)
    }

    @Test(arguments: [false, true])
    func putHeadReadWithMetadata(versioned: Bool) async throws {
        let s = try await objects(versioned: versioned)
        let bytes = (0 ..< 100_000).map { UInt8($0 % 251) }
        let src = try tempFile(bytes)
        defer { try? FileManager.default.removeItem(at: src) }
        let put = try await s.put("a/b c.bin", contentsOf: src, metadata: meta, condition: .ifAbsent)
        #expect(put.size == 100_000)
        let head = try await s.head("a/b c.bin")
        #expect(head.version == put.version && head.metadata == meta && head.size == 100_000)
        #expect(try await s.client.send(.HEAD, key: "drive/a/b c.bin").status == 200)  // under the prefix
        #expect(bytesDiffer(try await s.read("a/b c.bin", version: put.version, range: 0 ..< 1_000_000), bytes) == nil)
        #expect([UInt8](try await s.read("a/b c.bin", version: put.version, range: 99_990 ..< 100_010)) == Array(bytes[99_990...]))
        #expect(try await s.read("a/b c.bin", version: put.version, range: 200_000 ..< 200_010).isEmpty)
        await #expect(throws: StoreError.notFound(key: "missing")) { try await s.head("missing") }
        await #expect(throws: StoreError.self) { try await s.head("../escape") }
    }

    @Test(arguments: [false, true])
    func conditionsAndPinnedReads(versioned: Bool) async throws {
        let s = try await objects(versioned: versioned)
        let one = try tempFile([1, 1, 1]), two = try tempFile([2, 2, 2])
        defer { try? FileManager.default.removeItem(at: one); try? FileManager.default.removeItem(at: two) }
        let v1 = try await s.put("k", contentsOf: one, metadata: meta, condition: .ifAbsent)
        await #expect(throws: StoreError.self) { try await s.put("k", contentsOf: two, metadata: meta, condition: .ifAbsent) }
        let v2 = try await s.put("k", contentsOf: two, metadata: meta, condition: .ifMatch(v1.version))
        #expect(v2.version != v1.version)
        await #expect(throws: StoreError.self) { try await s.put("k", contentsOf: one, metadata: meta, condition: .ifMatch(v1.version)) }
        #expect([UInt8](try await s.read("k", version: v2.version, range: 0 ..< 3)) == [2, 2, 2])
        if versioned {
            // The bucket keeps it: the old version still reads, never mixed with the new.
            #expect([UInt8](try await s.read("k", version: v1.version, range: 0 ..< 3)) == [1, 1, 1])
        } else {
            await #expect(throws: StoreError.notFound(key: "k")) { try await s.read("k", version: v1.version, range: 0 ..< 3) }
        }
        await #expect(throws: StoreError.self) { try await s.delete("k", condition: .ifMatch(v1.version)) }
        try await s.delete("k", condition: .ifMatch(v2.version))
        await #expect(throws: StoreError.notFound(key: "k")) { try await s.head("k") }
        try await s.delete("k", condition: .always)
    }

    @Test(arguments: [false, true])
    func serverSideCopyMovesAndUpdatesMetadata(versioned: Bool) async throws {
        let s = try await objects(versioned: versioned)
        let src = try tempFile([9, 8, 7])
        defer { try? FileManager.default.removeItem(at: src) }
        let v = try await s.put("src", contentsOf: src, metadata: meta, condition: .ifAbsent)
        let c = try await s.copy(from: "src", version: v.version, to: "dir/dst", metadata: nil, condition: .ifAbsent)
        #expect(c.size == 3 && c.contentTag == v.contentTag)
        #expect([UInt8](try await s.read("dir/dst", version: c.version, range: 0 ..< 10)) == [9, 8, 7])
        #expect(try await s.head("dir/dst").metadata == meta)
        await #expect(throws: StoreError.self) {
            try await s.copy(from: "src", version: v.version, to: "dir/dst", metadata: nil, condition: .ifAbsent)
        }
        var m = meta
        m.mode = 0o600
        let updated = try await s.copy(from: "src", version: v.version, to: "src", metadata: m, condition: .ifMatch(v.version))
        #expect(try await s.head("src").metadata.mode == 0o600)
        #expect(updated.contentTag == v.contentTag)  // same bytes, new metadata
    }

    /// S3 keeps 2 KB of user metadata: more goes in an object of its own, named by its hash.
    @Test func largeMetadataGoesBesideTheObject() async throws {
        let s = try await objects(versioned: false)
        var big = meta
        big.xattrs["user.big"] = Data((0 ..< 6000).map { UInt8($0 % 256) })
        let put = try await s.put("x", contentsOf: nil, metadata: big, condition: .always)
        let head = try await s.head("x")
        #expect(head.metadata == big && head.version == put.version)
        #expect(try await s.client.send(.HEAD, key: "drive/x").header("x-amz-meta-ubiq")?.hasPrefix("ref:") == true)
        // The metadata object is the store's own: not a file to list.
        let listed = try await s.listAll(under: "")
        #expect(listed.objects.map(\.key) == ["x"])
        var small = big
        small.xattrs = [:]
        let copied = try await s.copy(from: "x", version: put.version, to: "x", metadata: small, condition: .ifMatch(put.version))
        #expect(try await s.head("x").metadata == small && copied.version != put.version)
    }

    /// SeaweedFS keeps a file `a` and a folder's marker `a/` as one entry: a DELETE of `a/`
    /// removed an empty file `a` (the marker's version is its ETag, an empty file's too, and a
    /// HEAD of `a/` answers for the file), and a DELETE of `a` an empty folder `a/`. A folder
    /// renamed away, then an empty file made at its name, lost the file to the old marker's
    /// delete. Each delete now finds its own kind of key there first: the other stays.
    @Test func aFoldersDeleteLeavesAFileOfItsName() async throws {
        let client = try await SeaweedFS.shared().newBucket("m")
        let s = S3Objects(client: client, prefix: "drive", versioned: false, keepsFolderMetadata: false)
        let folder = ObjectMetadata(kind: .directory, mode: 0o755, uid: 0, gid: 0, mtimeNs: 1)
        let marker = try await s.put("d/", contentsOf: nil, metadata: folder, condition: .ifAbsent)
        try await s.delete("d/", condition: .ifMatch(marker.version))  // the folder goes (renamed away)
        _ = try await s.put("d", contentsOf: nil, metadata: meta, condition: .ifAbsent)  // an empty file takes its name
        await #expect(throws: StoreError.self) { try await s.delete("d/", condition: .ifMatch(marker.version)) }
        try await s.delete("d/", condition: .always)
        #expect(try await s.head("d").size == 0, "the empty file d is gone")
        // And the other way round: a file's delete leaves an empty folder of its name.
        let file = try await s.put("e", contentsOf: nil, metadata: meta, condition: .ifAbsent)
        try await s.delete("e", condition: .ifMatch(file.version))
        _ = try await s.put("e/", contentsOf: nil, metadata: folder, condition: .ifAbsent)
        try await s.delete("e", condition: .always)
        #expect(try await s.listsMarker("e/"), "the empty folder e/ is gone")
    }

    /// A sidecar far larger than any metadata (a hostile one of megabytes, named by its true
    /// digest) is read to its bound, refused with one reason, and never fetched again: the
    /// object reads as one whose metadata cannot be used. (One of 200 MB was fetched at every
    /// poll, by every device, without end.)
    @Test func aHugeSidecarIsRefusedOnceAndNotFetchedAgain() async throws {
        let s = try await objects(versioned: false)
        let huge = Data(repeating: 0x7B, count: S3Objects.maxSidecarBytes * 3)
        let name = SigV4.sha256Hex(huge)
        try await s.client.send(.PUT, key: "drive/" + S3Objects.reserved + "meta/" + name, body: .data(huge))
        try await s.client.send(.PUT, key: "drive/x", headers: ["x-amz-meta-ubiq": "ref:" + name], body: .data(Data("x".utf8)))
        let first = try await s.head("x")
        #expect(first.metadata.issues.contains { $0.contains("larger than any metadata") }, "\(first.metadata.issues)")
        // Gone from the bucket now: a second read that fetched it would say it is missing.
        try await s.client.send(.DELETE, key: "drive/" + S3Objects.reserved + "meta/" + name)
        let second = try await s.head("x")
        #expect(second.metadata.issues == first.metadata.issues, "\(second.metadata.issues)")
    }
}
