import Foundation
import Testing
import TestSupport
import UbiqStore
@testable import UbiqS3

/// What the S3 store does beyond the conformance suite: objects other tools wrote, keys that
/// are not names, the metadata index, uploads in parts, and addresses.
@Suite struct S3StoreTests {
    let meta = ObjectMetadata(kind: .file, mode: 0o640, uid: 1000, gid: 1000, mtimeNs: 1_700_000_000_123_456_789, origin: "dev:7:1")

    @Test func addressesAreParsedOrRefusedClearly() throws {
        let l = try S3Location("s3://my-bucket/photos/2024/")
        #expect(l.bucket == "my-bucket" && l.prefix == "photos/2024/")
        #expect(try S3Location("s3://my.bucket").prefix == "")
        for bad in ["http://b/x", "s3://", "s3://B", "s3://ab", "s3://-bucket", "s3://bucket/a/../b", "s3://bucket/a//b"] {
            #expect(throws: StoreError.self, "\(bad)") { try S3Location(bad) }
        }
    }

    /// A folder's key is a folder only where it has a marker: SeaweedFS answers a HEAD of `a/`
    /// for a directory of its own that holds objects (a made-up object, ETag `…-0`) and for a
    /// file `a`. Both are no folder, to a fresh store as to the one that deleted the marker
    /// (a renamed folder came back empty from such an answer); and a marker is still written,
    /// or copied, where the server has such a directory.
    @Test func aFolderKeyIsAFolderOnlyWhereItHasAMarker() async throws {
        let (store, cleanup) = try await SeaweedFS.shared().newStore(versioned: false, settleWindow: 0)
        defer { cleanup() }
        let folder = ObjectMetadata(kind: .directory, mode: 0o755, uid: 0, gid: 0, mtimeNs: 1)
        // Objects in d/ and none at d/: the server's directory is no folder here.
        _ = try await store.put("d/f", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent)
        await #expect(throws: StoreError.notFound(key: "d/")) { try await store.objects.head("d/") }
        await #expect(throws: StoreError.notFound(key: "d/")) { try await store.head("d/") }
        // A marker is written over it, If-None-Match though it is.
        let marker = try await store.put("d/", contentsOf: nil, metadata: folder, condition: .ifAbsent)
        #expect(try await store.head("d/").version == marker.version)
        // Deleted (the folder renamed away) while its objects stay for a moment: no folder,
        // also to a store that did not see the delete (a daemon started again).
        try await store.delete("d/", condition: .ifMatch(marker.version))
        let (again, cleanupAgain) = try await SeaweedFS.shared().store(of: store.objects.client.endpoint.bucket, settleWindow: 0)
        defer { cleanupAgain() }
        await #expect(throws: StoreError.notFound(key: "d/")) { try await store.head("d/") }
        await #expect(throws: StoreError.notFound(key: "d/")) { try await again.head("d/") }
        // A marker copied there (a folder moved to d/).
        let other = try await store.put("o/", contentsOf: nil, metadata: folder, condition: .ifAbsent)
        let moved = try await store.copy(from: "o/", version: other.version, to: "d/", metadata: nil, condition: .ifAbsent)
        #expect(try await again.head("d/").version == moved.version)
        // A file e answers a HEAD of e/ on this server: that is no folder either.
        _ = try await store.put("e", contentsOf: try tempFile([1]), metadata: meta, condition: .ifAbsent)
        await #expect(throws: StoreError.notFound(key: "e/")) { try await store.objects.head("e/") }
        #expect(try await store.head("e").size == 1)
    }

    /// Objects another tool wrote (no ubiq metadata) show as the user's, 0644 (folders 0755),
    /// modified when S3 says.
    @Test func foreignObjectsGetSensibleMetadata() async throws {
        let (store, cleanup) = try await SeaweedFS.shared().newStore(versioned: false)
        defer { cleanup() }
        let c = store.objects.client
        try await c.send(.PUT, key: "drive/docs/", body: .data(Data()))
        let before = Date().timeIntervalSince1970
        try await c.send(.PUT, key: "drive/docs/readme.txt", body: .data(Data("hello".utf8)))
        let after = Date().timeIntervalSince1970
        try await c.send(.PUT, key: "drive/loose/file", body: .data(Data("x".utf8)))
        let listed = try await store.list(prefix: "")
        #expect(listed.map(\.key) == ["docs/", "docs/readme.txt", "loose/file"])
        let readme = try #require(listed.first { $0.key == "docs/readme.txt" })
        #expect(readme.metadata.kind == .file && readme.metadata.mode == 0o644 && readme.metadata.uid == getuid())
        // When the PUT was made (S3's times are whole seconds), however long the listing took.
        let mtime = Double(readme.metadata.mtimeNs) / 1e9
        #expect(mtime >= before.rounded(.down) - 1 && mtime <= after + 1, "\(mtime) not within \(before) ... \(after)")
        #expect(readme.size == 5)
        #expect(listed[0].metadata.kind == .directory && listed[0].metadata.mode == 0o755)
        #expect([UInt8](try await store.read("docs/readme.txt", version: readme.version, range: 0 ..< 5)) == Array("hello".utf8))
    }

    /// Keys that are not valid names are left out of listings and the feed (and logged), never
    /// turned into a path: the server's answer is parsed as bytes.
    @Test func keysThatAreNotNamesAreSkipped() async throws {
        let (store, cleanup) = try await SeaweedFS.shared().newStore(versioned: false)
        defer { cleanup() }
        let c = store.objects.client
        for key in ["drive/ok", "drive/tab\there"] {
            try await c.send(.PUT, key: key, body: .data(Data("1".utf8)))
        }
        let listed = try await store.list(prefix: "")
        #expect(listed.map(\.key) == ["ok", "tab\there"])
        let start = try await store.changes(since: nil, limit: 100)
        #expect(start.changes.map(\.key) == ["ok", "tab\there"])
        // A page as a server might send it: NUL, invalid UTF-8, dot segments, a key outside the prefix.
        let page = """
            <ListBucketResult><EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>
            <Contents><Key>drive/a%00b</Key><ETag>"1"</ETag><Size>1</Size></Contents>
            <Contents><Key>drive/bad%FF%FE</Key><ETag>"2"</ETag><Size>1</Size></Contents>
            <Contents><Key>drive/../etc/passwd</Key><ETag>"3"</ETag><Size>1</Size></Contents>
            <Contents><Key>drive/./x</Key><ETag>"4"</ETag><Size>1</Size></Contents>
            <Contents><Key>drive/a//b</Key><ETag>"4"</ETag><Size>1</Size></Contents>
            <Contents><Key>drive/\(String(repeating: "n", count: 256))</Key><ETag>"4"</ETag><Size>1</Size></Contents>
            <Contents><Key>other/y</Key><ETag>"5"</ETag><Size>1</Size></Contents>
            <Contents><Key>drive/.ubiquity/s3/meta/abc</Key><ETag>"6"</ETag><Size>1</Size></Contents>
            <Contents><Key>drive/caf%C3%A9+ok</Key><ETag>&#34;7&#34;</ETag><Size>1</Size><LastModified>2026-01-02T03:04:05.000Z</LastModified></Contents>
            </ListBucketResult>
            """
        var out = Listing(taken: Date())
        #expect(store.objects.parse(page, into: &out) == nil)
        #expect(out.objects.map(\.key) == ["café ok"] && out.objects.first?.etag == "\"7\"")
        #expect(out.objects.first?.modified == Date(timeIntervalSince1970: 1_767_323_045))
        #expect(out.skipped.map(\.reason) == ["contains NUL", "not UTF-8", "dot segment", "dot segment", "empty segment", "segment too long"])
    }

    /// A listing asks S3 for metadata (HEAD) only for objects new or changed since the index
    /// last saw them: another tool's, here. This device's own puts are known from what its log
    /// entries say they wrote, borne out by the listing.
    @Test func listingsHeadOnlyWhatChanged() async throws {
        let (store, cleanup) = try await SeaweedFS.shared().newStore(versioned: false, settleWindow: 0)
        defer { cleanup() }
        for i in 0 ..< 20 { try await store.objects.send(.PUT, "f\(i)", body: .data(Data([UInt8(i)])), validate: false) }
        var own: [ObjectInfo] = []
        for i in 0 ..< 5 { own.append(try await store.put("g\(i)", contentsOf: try tempFile([UInt8(i)]), metadata: meta, condition: .ifAbsent)) }
        let first = try await store.list(prefix: "")
        #expect(first.count == 25 && store.headsForLastListing == 20, "\(store.headsForLastListing) HEADs")
        for info in own { #expect(first.first { $0.key == info.key } == info, "\(info.key)") }
        let again = try await store.list(prefix: "")
        #expect(again == first && store.headsForLastListing == 0)
        try await store.objects.send(.PUT, "f3", body: .data(Data([9, 9])), validate: false)
        let third = try await store.list(prefix: "")
        #expect(store.headsForLastListing == 1 && third.first { $0.key == "f3" }?.size == 2)
    }

    /// Big files go up in parts, several at once; the result reads back whole.
    @Test func largeFilesGoInParts() async throws {
        let (store, cleanup) = try await SeaweedFS.shared().newStore(versioned: false, multipartThreshold: 8 << 20)
        defer { cleanup() }
        let bytes = (0 ..< (40 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 16) }
        let src = try tempFile(bytes)
        defer { unlink(src.path) }
        let seen = Seen()
        let info = try await store.put("big.bin", contentsOf: src, metadata: meta, condition: .ifAbsent,
                                       progress: { seen.add($0) })
        #expect(info.size == 40 << 20)
        #expect(info.contentTag?.hasSuffix("-3\"") == true, "\(info.contentTag ?? "")")  // 16 + 16 + 8 MiB
        #expect(seen.max == 40 << 20)
        let head = try await store.head("big.bin")
        #expect(head.version == info.version && head.metadata == meta)
        #expect(bytesDiffer(try await store.read("big.bin", version: info.version, range: 0 ..< (41 << 20)), bytes) == nil)
        // A create over it is refused, at completion.
        await #expect(throws: StoreError.self) {
            try await store.put("big.bin", contentsOf: src, metadata: meta, condition: .ifAbsent)
        }
        #expect(try await uploadsUnderWay(store).isEmpty)  // the refused one was aborted
    }

    /// A part upload cut off (the device crashed, the link went down) is taken up again when
    /// the same bytes are sent again: the parts already there are not sent twice.
    @Test func aPartUploadIsResumed() async throws {
        let (store, cleanup) = try await SeaweedFS.shared().newStore(versioned: false, multipartThreshold: 8 << 20)
        defer { cleanup() }
        let bytes = (0 ..< (40 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let src = try tempFile(bytes)
        defer { unlink(src.path) }
        let o = store.objects
        // As a crash leaves it: the upload begun and journalled, its first part sent.
        let text = try await o.encode(meta, key: "big")
        let r = try await o.send(.POST, "big", query: [("uploads", "")], headers: [S3Objects.metadataHeader: text])
        let id = try #require(S3Client.xmlValue("UploadId", in: r.text))
        store.index.started(key: "big", fingerprint: "\(40 << 20):\(meta.origin!):\(text)", uploadID: id)
        let fd = open(src.path, O_RDONLY)
        try await o.send(.PUT, "big", query: [("partNumber", "1"), ("uploadId", id)],
                         body: .file(fd: fd, offset: 0, length: 16 << 20, progress: nil))
        close(fd)
        let seen = Seen()
        let info = try await store.put("big", contentsOf: src, metadata: meta, condition: .ifAbsent, progress: { seen.add($0) })
        #expect(seen.min > 16 << 20, "the first part was sent again")
        #expect(bytesDiffer(try await store.read("big", version: info.version, range: 0 ..< (40 << 20)), bytes) == nil)
        #expect(store.index.upload(key: "big") == nil)
        #expect(try await uploadsUnderWay(store).isEmpty)
        // Other bytes under the same key: the old upload is of no use and is aborted.
        let r2 = try await o.send(.POST, "big", query: [("uploads", "")], headers: [S3Objects.metadataHeader: text])
        store.index.started(key: "big", fingerprint: "stale", uploadID: try #require(S3Client.xmlValue("UploadId", in: r2.text)))
        _ = try await store.put("big", contentsOf: src, metadata: meta, condition: .always)
        #expect(try await uploadsUnderWay(store).isEmpty)
        // Leftovers no device takes up are aborted after a day (here: at once).
        _ = try await o.send(.POST, "orphan", query: [("uploads", "")])
        #expect(try await o.abortStaleUploads(olderThan: -1) == 1)
        #expect(try await uploadsUnderWay(store).isEmpty)
    }

    func uploadsUnderWay(_ store: S3Store) async throws -> [String] {
        let r = try await store.objects.client.send(.GET, key: nil, query: [("uploads", "")])
        return S3Client.xmlBlocks("Upload", in: r.text).compactMap { S3Client.xmlValue("UploadId", in: $0) }
    }
}

/// Progress reports heard.
final class Seen: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [Int64] = []
    func add(_ v: Int64) { lock.withLock { values.append(v) } }
    var max: Int64 { lock.withLock { values.max() ?? 0 } }
    var min: Int64 { lock.withLock { values.min() ?? 0 } }
}
