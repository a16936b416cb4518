import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Testing
import UbiqStore
import TestSupport
@testable import UbiqS3

/// The S3 client against a real SeaweedFS: signed requests, conditional writes, listing
/// pages, ranged reads, file bodies, and each failure mapped to the store's errors.
@Suite struct S3ClientTests {
    @Test func objectsGoInComeOutAndAreListed() async throws {
        let s3 = try await SeaweedFS.shared().newBucket()
        let put = try await s3.send(.PUT, key: "dir/hello world+€.txt", headers: ["x-amz-meta-ubiq": "meta"],
                                    body: .data(Data("hello, S3".utf8)))
        let etag = try #require(put.header("ETag"))
        let head = try await s3.send(.HEAD, key: "dir/hello world+€.txt")
        #expect(head.header("Content-Length") == "9")
        #expect(head.header("x-amz-meta-ubiq") == "meta")
        #expect(head.header("ETag") == etag)
        let part = try await s3.send(.GET, key: "dir/hello world+€.txt", headers: ["Range": "bytes=7-8", "If-Match": etag])
        #expect(part.text == "S3")
        // Listing, two keys a page.
        for i in 0 ..< 5 { try await s3.send(.PUT, key: "many/k\(i)", body: .data(Data("\(i)".utf8))) }
        var keys: [String] = []
        var token: String?
        var pages = 0
        repeat {
            var q = [("list-type", "2"), ("prefix", "many/"), ("max-keys", "2")]
            if let token { q.append(("continuation-token", token)) }
            let page = try await s3.send(.GET, key: nil, query: q).text
            keys += page.components(separatedBy: "<Key>").dropFirst().map { String($0.prefix { $0 != "<" }) }
            token = page.contains("<IsTruncated>true</IsTruncated>") ? S3Client.xmlValue("NextContinuationToken", in: page) : nil
            pages += 1
        } while token != nil
        #expect(keys == (0 ..< 5).map { "many/k\($0)" })
        #expect(pages == 3)
        try await s3.send(.DELETE, key: "dir/hello world+€.txt")
        await #expect(throws: StoreError.notFound(key: "dir/hello world+€.txt")) {
            try await s3.send(.GET, key: "dir/hello world+€.txt")
        }
    }

    @Test func conditionalWritesLoseRacesCleanly() async throws {
        let s3 = try await SeaweedFS.shared().newBucket()
        let first = try await s3.send(.PUT, key: "c", headers: ["If-None-Match": "*"], body: .data(Data("1".utf8)))
        await #expect(throws: StoreError.preconditionFailed(key: "c", current: nil)) {
            try await s3.send(.PUT, key: "c", headers: ["If-None-Match": "*"], body: .data(Data("2".utf8)))
        }
        await #expect(throws: StoreError.preconditionFailed(key: "c", current: nil)) {
            try await s3.send(.PUT, key: "c", headers: ["If-Match": "\"0123456789abcdef0123456789abcdef\""], body: .data(Data("2".utf8)))
        }
        try await s3.send(.PUT, key: "c", headers: ["If-Match": first.header("ETag")!], body: .data(Data("3".utf8)))
        #expect(try await s3.send(.GET, key: "c").text == "3")
        // A read pinned to a version that is gone fails; it never mixes versions.
        await #expect(throws: StoreError.preconditionFailed(key: "c", current: nil)) {
            try await s3.send(.GET, key: "c", headers: ["Range": "bytes=0-0", "If-Match": first.header("ETag")!])
        }
    }

    @Test func aFileIsSentAsItIsRead() async throws {
        let s3 = try await SeaweedFS.shared().newBucket()
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3-body-\(UUID().uuidString)").path
        defer { unlink(path) }
        let bytes = Data((0 ..< 3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        #expect(FileManager.default.createFile(atPath: path, contents: bytes))
        let fd = open(path, O_RDONLY)
        defer { close(fd) }
        let seen = Progress()
        try await s3.send(.PUT, key: "big", body: .file(fd: fd, offset: 0, length: Int64(bytes.count), progress: { seen.add($0) }))
        // SeaweedFS on a loaded machine now and then answers a plain GET with fewer bytes (none):
        // asked again, as the product does (`S3Objects` reads with the listed length).
        var back = try await s3.send(.GET, key: "big")
        for _ in 0 ..< 3 where back.data.count != bytes.count { back = try await s3.send(.GET, key: "big") }
        #expect(bytesDiffer(back.data, bytes) == nil)
        #expect(seen.values.last == Int64(bytes.count) && seen.values.count == 3)
    }

    @Test func failuresAreNamed() async throws {
        let server = try SeaweedFS.shared()
        let wrong = S3Client(endpoint: S3Endpoint(url: server.endpoint, region: "us-east-1", bucket: "any",
                                                  credentials: S3Credentials(accessKey: server.accessKey, secretKey: "not-the-secret")),
                             logger: Logger(label: "s3-test"))
        do {
            try await wrong.send(.GET, key: "k")
            Issue.record("a bad secret was accepted")
        } catch let e as StoreError {
            #expect("\(e)".contains("access denied") && !"\(e)".contains("not-the-secret"), "\(e)")
        }
        let s3 = try await server.newBucket()
        let missing = S3Client(endpoint: S3Endpoint(url: server.endpoint, region: "us-east-1", bucket: "no-such-bucket-here",
                                                    credentials: server.credentials), logger: Logger(label: "s3-test"))
        await #expect(throws: StoreError.failed("no such bucket")) { try await missing.send(.GET, key: "k") }
        _ = s3
        // Nothing listens there: unavailable (worth retrying later), after this client's own tries.
        let down = S3Client(endpoint: S3Endpoint(url: URL(string: "http://127.0.0.1:9")!, region: "us-east-1", bucket: "b",
                                                 credentials: server.credentials),
                            logger: Logger(label: "s3-test"), attempts: 2)
        do {
            try await down.send(.GET, key: "k")
            Issue.record("a closed port answered")
        } catch let e as StoreError {
            #expect(e.isTransient, "\(e)")
        }
    }

    /// A service that cannot be reached is said once, not at every try of every request (a
    /// device offline with 50 uploads queued said 600 lines a minute), and once when it
    /// answers again (anything: here a plain HTTP server's 404).
    @Test func anUnreachableServiceIsSaidOnceAndAgainWhenItAnswers() async throws {
        let port = try Self.freePort()
        let lines = LogLines()
        let client = S3Client(endpoint: S3Endpoint(url: URL(string: "http://127.0.0.1:\(port)")!, region: "us-east-1", bucket: "b",
                                                   credentials: S3Credentials(accessKey: "a", secretKey: "s", source: "test")),
                              logger: Logger(label: "s3-test") { _ in LogLines.Handler(lines: lines) }, attempts: 3)
        for _ in 0 ..< 4 {
            await #expect(throws: StoreError.self) { try await client.send(.GET, key: "k") }
        }
        #expect(lines.count("cannot be reached") == 1 && lines.all.count == 1, "\(lines.all)")
        let dir = TempPaths.make("ubiq-http").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let server = Process()
        server.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        server.arguments = ["-m", "http.server", String(port), "--bind", "127.0.0.1", "--directory", dir]
        server.standardOutput = FileHandle.nullDevice
        server.standardError = FileHandle.nullDevice
        try server.run()
        defer { kill(server.processIdentifier, SIGKILL); server.waitUntilExit() }
        #expect(waitUntil(seconds: 30, every: 0.05) { (try? Self.connects(port)) == true })
        await #expect(throws: StoreError.self) { try await client.send(.GET, key: "k") }
        #expect(lines.count("answers again") == 1 && lines.all.count == 2, "\(lines.all)")
    }

    static func freePort() throws -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &a) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
        }
        guard ok else { throw POSIXError(.EADDRINUSE) }
        return UInt16(bigEndian: a.sin_port)
    }

    static func connects(_ port: UInt16) throws -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = port.bigEndian
        a.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &a) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }

    /// A bucket is made when missing (and making it again changes nothing); whether it keeps
    /// versions is read from the bucket, before and after versioning is turned on.
    @Test func bucketsAreMadeAndTheirVersioningRead() async throws {
        let server = try SeaweedFS.shared()
        let s3 = S3Client(endpoint: S3Endpoint(url: server.endpoint, region: "us-east-1",
                                               bucket: "made-\(UUID().uuidString.prefix(8).lowercased())", credentials: server.credentials),
                          logger: Logger(label: "s3-test"))
        try await s3.ensureBucket()
        try await s3.send(.PUT, key: "k", body: .data(Data("x".utf8)))
        try await s3.ensureBucket()
        #expect(try await s3.send(.GET, key: "k").text == "x")
        #expect(try await !s3.bucketKeepsVersions())
        let enable = "<VersioningConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Status>Enabled</Status></VersioningConfiguration>"
        try await s3.send(.PUT, key: nil, query: [("versioning", "")], body: .data(Data(enable.utf8)))
        #expect(try await s3.bucketKeepsVersions())
    }

    @Test func errorAnswersMapToTheStoresErrors() {
        func answer(_ status: Int, _ code: String) -> StoreError {
            var body = ByteBuffer()
            body.writeString("<?xml version=\"1.0\"?><Error><Code>\(code)</Code><Message>m</Message></Error>")
            return S3Client.error(for: S3Response(status: status, headers: [:], body: body), key: "k", method: .PUT)
        }
        #expect(answer(404, "NoSuchKey") == .notFound(key: "k"))
        #expect(answer(412, "PreconditionFailed") == .preconditionFailed(key: "k", current: nil))
        #expect(answer(409, "ConditionalRequestConflict") == .preconditionFailed(key: "k", current: nil))
        #expect(answer(503, "SlowDown").isTransient)
        #expect(answer(500, "InternalError").isTransient)
        #expect(answer(400, "SlowDown").isTransient)
        #expect(!answer(403, "SignatureDoesNotMatch").isTransient)
        #expect(answer(400, "EntityTooLarge") == .quotaExceeded(key: "k"))
        #expect(!answer(400, "InvalidArgument").isTransient)
        #expect(S3Client.xmlValue("Key", in: "<Key>a &amp; b&lt;</Key>") == "a & b<")
    }

    /// Elements are found by their tags' bytes: a longer tag that starts alike is another
    /// element, text around and inside may be any UTF-8, an element left open ends the search,
    /// and a search within a block stays in it.
    @Test func xmlElementsAreFoundByTheirBytes() {
        let xml = "<R><KeyCount>2</KeyCount><é>x</é><C><Key>été &#x1F600;</Key><Size>1</Size></C>"
            + "<C><Size>2</Size></C><C><Key>b</Key></C><Key>open"
        #expect(S3Client.xmlValue("Key", in: xml) == "été 😀")
        #expect(S3Client.xmlValue("KeyCount", in: xml) == "2")
        #expect(S3Client.xmlValue("é", in: xml) == "x")
        #expect(S3Client.xmlValue("Missing", in: xml) == nil)
        #expect(S3Client.xmlBlocks("C", in: xml) == ["<Key>été &#x1F600;</Key><Size>1</Size>", "<Size>2</Size>", "<Key>b</Key>"])
        #expect(S3Client.xmlBlocks("Key", in: xml) == ["été &#x1F600;", "b"])
        S3XML.reading(xml) { b in
            let blocks = S3XML.elements("C", in: b)
            #expect(blocks.map { S3XML.value("Key", in: b, within: $0) } == ["été 😀", nil, "b"])
            #expect(S3XML.elements("C", in: b, limit: 2).count == 2)
            #expect(S3XML.elements("Key", in: b, within: blocks[1]).isEmpty)
        }
        #expect(S3Client.xmlBlocks("C", in: "") == [] && S3Client.xmlValue("C", in: "<C>") == nil)
        // Entities: the five named, decimal and hexadecimal; what is not one stays as it is.
        #expect(S3Client.xmlUnescape("&amp;&lt;&gt;&quot;&apos;&#34;&#x22;&#X41;é&#233;&#x1F600;")
            == "&<>\"'\"\"Aéé😀")
        #expect(S3Client.xmlUnescape("&bogus; &#xD800; &; &#; &amp &#1234567890123; a&b") == "&bogus; &#xD800; &; &#; &amp &#1234567890123; a&b")
    }

    @Test func credentialsComeFromTheStandardPlaces() throws {
        let home = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-home-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: home) }
        let env = try S3Credentials.resolve(environment: ["AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_SESSION_TOKEN": "T"], home: home)
        #expect(env.accessKey == "AK" && env.secretKey == "SK" && env.sessionToken == "T" && env.source == "environment")
        #expect(!"\(env)".contains("SK"))
        #expect(throws: S3Credentials.Missing.self) { try S3Credentials.resolve(environment: ["AWS_ACCESS_KEY_ID": "AK"], home: home) }
        #expect(throws: S3Credentials.Missing.self) { try S3Credentials.resolve(environment: [:], home: home) }
        try FileManager.default.createDirectory(atPath: home + "/.aws", withIntermediateDirectories: true)
        try """
            # comment
            [default]
            aws_access_key_id = DEF
            aws_secret_access_key = defsecret

            [work]
            aws_access_key_id=WORK
            aws_secret_access_key=worksecret
            aws_session_token = tok
            """.write(toFile: home + "/.aws/credentials", atomically: true, encoding: .utf8)
        let def = try S3Credentials.resolve(environment: [:], home: home)
        #expect(def.accessKey == "DEF" && def.secretKey == "defsecret" && def.sessionToken == nil)
        let work = try S3Credentials.resolve(environment: ["AWS_PROFILE": "work"], home: home)
        #expect(work.accessKey == "WORK" && work.secretKey == "worksecret" && work.sessionToken == "tok")
        #expect(work.source.hasSuffix("[work]"))
        #expect(throws: S3Credentials.Missing.self) { try S3Credentials.resolve(environment: ["AWS_PROFILE": "nope"], home: home) }
    }

    /// Answers that contradict themselves or the request are tried again, never taken as bytes:
    /// a 416 for a range inside the object (by its own Content-Range), a 206 shorter than it says,
    /// or one for other bytes. A 200 to a ranged GET (a server that ignored Range) gives only the
    /// range. (A server under load has sent such answers; taken at their word they read as empty.)
    @Test func answersThatContradictThemselvesAreTriedAgain() async throws {
        let bytes = Data((0 ..< 100).map { UInt8($0) })
        func client(_ server: ScriptedHTTPServer) -> S3Client {
            S3Client(endpoint: S3Endpoint(url: server.endpoint, region: "us-east-1", bucket: "b",
                                          credentials: S3Credentials(accessKey: "k", secretKey: "s")),
                     logger: Logger(label: "s3-test"), attempts: 4)
        }
        let range = ["Range": "bytes=10-19"]
        let server = try ScriptedHTTPServer([
            .init(416, headers: [("Content-Range", "bytes */100")], body: Data("<Error><Code>InvalidRange</Code></Error>".utf8)),
            .init(206, headers: [("Content-Range", "bytes 10-19/100")], body: bytes[10 ..< 15]),
            .init(206, headers: [("Content-Range", "bytes 11-20/100")], body: bytes[11 ..< 21]),
            .init(206, headers: [("Content-Range", "bytes 10-19/100")], body: bytes[10 ..< 20]),
        ])
        defer { server.stop() }
        #expect(try await client(server).send(.GET, key: "k", headers: range).data == bytes[10 ..< 20])
        #expect(server.requests.count == 4)

        // A range past the end of the object, by the answer's own size: not satisfiable, at once.
        let past = try ScriptedHTTPServer([
            .init(416, headers: [("Content-Range", "bytes */5")], body: Data("<Error><Code>InvalidRange</Code></Error>".utf8)),
        ])
        defer { past.stop() }
        await #expect(throws: StoreError.failed("GET k: 416 InvalidRange")) { try await client(past).send(.GET, key: "k", headers: range) }
        #expect(past.requests.count == 1)

        // Too many contradictions: unavailable (the store's transient failure), not bytes.
        let stubborn = try ScriptedHTTPServer(Array(repeating: .init(206, headers: [("Content-Range", "bytes 10-19/100")], body: Data()), count: 4))
        defer { stubborn.stop() }
        do {
            _ = try await client(stubborn).send(.GET, key: "k", headers: range)
            Issue.record("an empty 206 was taken")
        } catch let e as StoreError {
            #expect(e.isTransient && "\(e)".contains("206 for bytes 10-19 with 0 bytes"), "\(e)")
        }

        // Into a file: a 206 for other bytes writes nothing; a 200 (the whole object) writes
        // only the range, at its place; the bytes around it are left alone.
        let file = try ScriptedHTTPServer([
            .init(206, headers: [("Content-Range", "bytes 10-29/100")], body: bytes[10 ..< 30]),
            .init(200, body: bytes),
        ])
        defer { file.stop() }
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3-range-\(UUID().uuidString)").path
        defer { unlink(path) }
        #expect(FileManager.default.createFile(atPath: path, contents: Data(repeating: 0xEE, count: 40)))
        let fd = open(path, O_RDWR)
        defer { close(fd) }
        let written = try await client(file).download(key: "k", headers: range, into: fd, at: 15)
        #expect(written == 10)
        let back = try Data(contentsOf: URL(fileURLWithPath: path))
        #expect(back == Data(repeating: 0xEE, count: 15) + bytes[10 ..< 20] + Data(repeating: 0xEE, count: 15))
        #expect(file.requests.count == 2)
    }

    /// A listing (or another answer this client reads as a document) that is not a whole one
    /// is asked again: a busy SeaweedFS answered 200 with an empty body, which read as an empty
    /// bucket, and a full listing that says so reads as every object deleted.
    @Test func aListingThatIsNotAWholeDocumentIsAskedAgain() async throws {
        let listing = #"<?xml version="1.0" encoding="UTF-8"?>"# + "\n" + #"<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">"#
            + "<IsTruncated>false</IsTruncated><Contents><Key>drive/a</Key><ETag>&quot;e&quot;</ETag><Size>1</Size></Contents></ListBucketResult>\n"
        #expect(S3Client.isWhole(Array(listing.utf8), root: "ListBucketResult"))
        #expect(S3Client.isWhole(Array(#"<VersioningConfiguration xmlns="x"/>"#.utf8), root: "VersioningConfiguration"))
        #expect(!S3Client.isWhole([UInt8](), root: "ListBucketResult"))
        #expect(!S3Client.isWhole(Array(listing.utf8.prefix(160)), root: "ListBucketResult"))  // cut short
        #expect(!S3Client.isWhole(Array("<ListBucketResults></ListBucketResults>".utf8), root: "ListBucketResult"))
        #expect(!S3Client.isWhole(Array("<Error><Code>x</Code></Error>".utf8), root: "ListBucketResult"))
        #expect(S3Client.answerRoot(.GET, key: nil, query: [("list-type", "2")]) == "ListBucketResult")
        #expect(S3Client.answerRoot(.GET, key: "k", query: []) == nil && S3Client.answerRoot(.PUT, key: nil, query: []) == nil)

        let server = try ScriptedHTTPServer([.init(200, body: Data()), .init(200, body: Data(listing.utf8.prefix(160))),
                                             .init(200, body: Data(listing.utf8))])
        defer { server.stop() }
        let client = S3Client(endpoint: S3Endpoint(url: server.endpoint, region: "us-east-1", bucket: "b",
                                                   credentials: S3Credentials(accessKey: "k", secretKey: "s")),
                              logger: Logger(label: "s3-test"), attempts: 4)
        let listed = try await S3Objects(client: client, prefix: "drive", versioned: false).listAll(under: "")
        #expect(listed.objects.map(\.key) == ["a"])
        #expect(server.requests.count == 3)
    }

    @Test func contentRangesAreRead() {
        #expect(S3Client.byteRange("bytes=0-9") == 0 ... 9)
        #expect(S3Client.byteRange("bytes=5-") == nil)
        #expect(S3Client.byteRange("bytes=9-0") == nil)
        #expect(S3Client.contentRange("bytes 0-9/100")! == (0, 9, 100))
        #expect(S3Client.contentRange("bytes 0-9/*")! == (0, 9, nil))
        #expect(S3Client.contentRange("bytes */100") == nil)
        let h = HTTPHeaders([("Content-Range", "bytes 0-9/10")])
        #expect(S3Client.inconsistency(status: 206, headers: h, asked: 0 ... 99, bodyLength: 10) == nil)  // clamped at the end
        #expect(S3Client.inconsistency(status: 416, headers: HTTPHeaders([("Content-Range", "bytes */0")]), asked: 0 ... 9, bodyLength: 0) == nil)
        #expect(S3Client.inconsistency(status: 200, headers: HTTPHeaders([("Content-Length", "10")]), asked: nil, bodyLength: 4) != nil)
    }
}

/// Progress reports, gathered from the upload's thread.
final class Progress: @unchecked Sendable {
    private let lock = NSLock()
    private var seen: [Int64] = []
    func add(_ v: Int64) { lock.lock(); seen.append(v); lock.unlock() }
    var values: [Int64] { lock.lock(); defer { lock.unlock() }; return seen }
}
