import AsyncHTTPClient
import Foundation
import UbiqClock
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import UbiqStore

/// Where an S3-compatible service is, and who we are to it.
public struct S3Endpoint: Sendable {
    /// `http(s)://host[:port]`: requests go path-style, `/BUCKET/KEY`.
    public var url: URL
    public var region: String
    public var bucket: String
    public var credentials: S3Credentials

    public init(url: URL, region: String, bucket: String, credentials: S3Credentials) {
        self.url = url; self.region = region; self.bucket = bucket; self.credentials = credentials
    }
}

/// One answer from the service.
public struct S3Response: Sendable {
    public var status: Int
    public var headers: HTTPHeaders
    public var body: ByteBuffer

    public func header(_ name: String) -> String? { headers.first(name: name) }
    public var text: String { String(buffer: body) }
    public var data: Data { Data(body.readableBytesView) }
}

/// What to send.
public enum S3Body: Sendable {
    case none
    case data(Data)
    /// `length` bytes of an open file from `offset` (sent as they are read; the payload is
    /// not hashed: UNSIGNED-PAYLOAD). `progress` hears the bytes sent so far.
    case file(fd: Int32, offset: Int64, length: Int64, progress: (@Sendable (Int64) -> Void)?)
}

/// Signed requests to an S3-compatible service, with S3's errors mapped to `StoreError`
/// and transient failures (5xx, SlowDown, a connection refused or cut, a timeout) tried again
/// with jittered backoff. Secrets are never logged.
public final class S3Client: Sendable {
    public let endpoint: S3Endpoint
    let http: HTTPClient
    let logger: Logger
    /// Every request but a GET goes to the log with its answer (UBIQ_TRACE_S3=1: to follow a
    /// crash test's history, scripts/crash-loop --trace).
    static let tracing = ProcessInfo.processInfo.environment["UBIQ_TRACE_S3"] == "1"
    /// Tries of a request that fails transiently (the first included).
    public let attempts: Int
    /// How a request that failed transiently is tried again: `attempts` tries in all, a
    /// jittered pause doubling from 0.2 s between them.
    var retries: RetryPolicy { RetryPolicy(first: 0.2, jitter: 0.5, tries: attempts) }
    public let timeout: TimeAmount
    /// Whether the service could not be reached at the last try: said once when that starts
    /// and once when it answers again, not at every try between (a device offline with 50
    /// uploads queued said each try of each, 600 lines a minute).
    private let unreachable = Atomic<Bool>(false)

    /// One HTTP client for the process (its connections are pooled per host). It does not
    /// retry a refused connection itself until the request's deadline: `send` retries, briefly,
    /// so that a store that is down is known as down at once.
    public static let processClient: HTTPClient = {
        var config = HTTPClient.Configuration()
        config.timeout = .init(connect: .seconds(10), read: .seconds(60))
        config.connectionPool.retryConnectionEstablishment = false
        // AHC keeps 8 connections a host by default: fewer than the 8 chunk downloads, 4 part
        // uploads and 16 metadata HEADs a mount may have under way at once.
        config.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = 32
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: config)
    }()

    public init(endpoint: S3Endpoint, logger: Logger, attempts: Int = 4, timeout: TimeAmount = .seconds(300),
                http: HTTPClient = S3Client.processClient) {
        self.endpoint = endpoint; self.logger = logger; self.attempts = max(1, attempts); self.timeout = timeout
        self.http = http
    }

    /// The request path of `key` in the bucket (`key` nil: the bucket itself).
    func path(_ key: String?) -> String {
        SigV4.encodePath("/" + endpoint.bucket + (key.map { "/" + $0 } ?? ""))
    }

    /// Sends a request and returns the answer when its status is 2xx (or 304); maps the
    /// others to `StoreError`. `key` nil addresses the bucket.
    /// `expectedLength`: how long a successful answer's body is (a GET of an object whose size
    /// a listing gave, and that is never rewritten); an answer of another length is tried
    /// again, as one that contradicts itself is (a busy SeaweedFS has answered 200 with an
    /// empty body, with headers that agreed).
    @discardableResult
    public func send(_ method: HTTPMethod, key: String?, query: [(String, String)] = [], headers: [String: String] = [:],
                     body: S3Body = .none, maxResponse: Int = 64 << 20, expectedLength: Int? = nil) async throws -> S3Response {
        try await retrying(method, key, query: query) {
            let r = try await once(method, key: key, query: query, headers: headers, body: body, maxResponse: maxResponse)
            let asked = headers["Range"].flatMap(Self.byteRange)
            if method == .GET, let wrong = Self.inconsistency(status: r.status, headers: r.headers, asked: asked, bodyLength: Int64(r.body.readableBytes)) {
                return .again(wrong)
            }
            if let expectedLength, (200 ..< 300).contains(r.status), r.body.readableBytes != expectedLength {
                return .again("\(r.status) with \(r.body.readableBytes) bytes where its listing says \(expectedLength)")
            }
            if (200 ..< 300).contains(r.status), let root = Self.answerRoot(method, key: key, query: query),
               !Self.isWhole(r.body.readableBytesView, root: root) {
                return .again("\(r.status) with \(r.body.readableBytes) bytes that are not a whole \(root)")
            }
            return (200 ..< 300).contains(r.status) || r.status == 304 ? .done(r) : .answered(r)
        }
    }

    private enum Outcome<T: Sendable>: Sendable {
        case done(T)
        /// An answer that is not a success: mapped to an error, tried again when transient.
        case answered(S3Response)
        /// An answer that contradicts itself or the request (`why`): tried again, as a transient
        /// failure is.
        case again(String)
    }

    /// The XML document a successful answer to this request is (nil: not one this client reads
    /// as a document): a listing of the bucket, of its versions, of its uploads or an upload's
    /// parts, its versioning.
    static func answerRoot(_ method: HTTPMethod, key: String?, query: [(String, String)]) -> String? {
        guard method == .GET else { return nil }
        let names = Set(query.map(\.0))
        if key != nil { return names.contains("uploadId") ? "ListPartsResult" : nil }
        if names.contains("list-type") { return "ListBucketResult" }
        if names.contains("versions") { return "ListVersionsResult" }
        if names.contains("uploads") { return "ListMultipartUploadsResult" }
        if names.contains("versioning") { return "VersioningConfiguration" }
        return nil
    }

    /// Whether `body` is a whole `root` document: the element opens within its first bytes
    /// and is closed at its end. A busy SeaweedFS has answered 200 with an empty body; a
    /// listing taken at its word is an empty bucket, and every object would read as deleted.
    static func isWhole(_ body: some Collection<UInt8>, root: String) -> Bool {
        let open = Array(("<" + root).utf8), close = Array(("</" + root + ">").utf8)
        let space: [UInt8] = [0x20, 0x0A, 0x0D, 0x09]
        let head = Array(body.prefix(1024))
        guard let at = (0 ..< head.count).first(where: { head[$0...].starts(with: open) }) else { return false }
        let rest = head[(at + open.count)...]
        guard let first = rest.first, first == UInt8(ascii: ">") || first == UInt8(ascii: "/") || space.contains(first),
              let gt = rest.firstIndex(of: UInt8(ascii: ">")) else { return false }
        if head[gt - 1] == UInt8(ascii: "/") { return true }  // `<Root .../>`: nothing in it
        let tail = body.suffix(close.count + 64).reversed().drop { space.contains($0) }
        return tail.prefix(close.count).reversed().elementsEqual(close)
    }

    /// `bytes=FIRST-LAST` of a request's Range header (one range, both ends given).
    static func byteRange(_ header: String) -> ClosedRange<Int64>? {
        guard header.hasPrefix("bytes=") else { return nil }
        let ends = header.dropFirst(6).split(separator: "-", omittingEmptySubsequences: false)
        guard ends.count == 2, let first = Int64(ends[0]), let last = Int64(ends[1]), first <= last else { return nil }
        return first ... last
    }

    /// What is wrong with an answer to a GET, if anything, by its own headers: a 206 whose body
    /// is not as long as its `Content-Range` says, or that starts elsewhere than asked; a 2xx body
    /// shorter than its `Content-Length`; a 416 ("not satisfiable") for a range that starts
    /// inside the object by the answer's own `Content-Range: bytes */SIZE`. A server under load
    /// (SeaweedFS answering many 500s) has sent such answers; taken at their word they read as
    /// empty or short bytes.
    /// `bodyLength` nil: the headers alone are checked (before the body is read).
    static func inconsistency(status: Int, headers: HTTPHeaders, asked: ClosedRange<Int64>?, bodyLength: Int64?) -> String? {
        let contentRange = headers.first(name: "Content-Range")
        switch status {
        case 206:
            guard let contentRange, let (first, last, _) = Self.contentRange(contentRange) else {
                return "206 without a valid Content-Range"
            }
            if let bodyLength, bodyLength != last - first + 1 { return "206 for bytes \(first)-\(last) with \(bodyLength) bytes" }
            if let asked, asked.lowerBound != first || last > asked.upperBound {
                return "206 for bytes \(first)-\(last) where \(asked.lowerBound)-\(asked.upperBound) was asked"
            }
        case 200 ..< 300:
            if let bodyLength, let length = headers.first(name: "Content-Length").flatMap({ Int64($0) }), bodyLength < length {
                return "\(status) with \(bodyLength) of its \(length) bytes"
            }
        case 416:
            if let asked, let contentRange, contentRange.hasPrefix("bytes */"), let size = Int64(contentRange.dropFirst(8)),
               asked.lowerBound < size {
                return "416 for bytes \(asked.lowerBound)- of an object of \(size) bytes"
            }
        default: break
        }
        return nil
    }

    /// `bytes FIRST-LAST/SIZE` (SIZE may be `*`) of a `Content-Range` header.
    static func contentRange(_ header: String) -> (Int64, Int64, Int64?)? {
        guard header.hasPrefix("bytes ") else { return nil }
        let parts = header.dropFirst(6).split(separator: "/", maxSplits: 1)
        guard parts.count == 2, let span = byteRange("bytes=" + parts[0]) else { return nil }
        return (span.lowerBound, span.upperBound, Int64(parts[1]))
    }

    /// Runs `attempt` until it is done, or fails for good: S3's transient answers and broken
    /// connections are tried again (`attempts` in all) after a jittered, doubling pause.
    /// What is said of a try that failed names the request (a bucket's listing by its query) and,
    /// for an answer, the server's own message.
    private func retrying<T: Sendable>(_ method: HTTPMethod, _ key: String?, query: [(String, String)] = [],
                                       _ attempt: () async throws -> Outcome<T>) async throws -> T {
        let what = (key ?? "") + (query.isEmpty ? "" : "?" + query.map { "\($0.0)=\($0.1)" }.joined(separator: "&"))
        let retries = self.retries
        var tries = 0
        while true {
            tries += 1
            do {
                let outcome = try await attempt()
                reached()
                switch outcome {
                case .done(let value): return value
                case .answered(let r):
                    let error = Self.error(for: r, key: key ?? "", method: method)
                    guard error.isTransient, retries.triesAgain(afterFailures: tries) else { throw error }
                    let said = Self.xmlValue("Message", in: r.text).map { ": \($0.prefix(200))" } ?? ""
                    logger.info("S3 \(method) \(what) answered \(r.status)\(said), trying again")
                case .again(let why):
                    guard retries.triesAgain(afterFailures: tries) else { throw StoreError.unavailable("\(method) \(what): the server answered \(why)") }
                    logger.notice("S3 \(method) \(what): the server answered \(why); trying again")
                }
            } catch let e as StoreError {
                throw e
            } catch let e as LocalWriteError {
                throw e  // the local disk, not the link
            } catch {
                // Could not reach it, or the connection broke: transient.
                let said = Self.describe(error)
                if !unreachable.exchange(true, ordering: .relaxed) {
                    logger.warning("S3 \(endpoint.url.absoluteString) cannot be reached (\(method) \(what): \(said)); every request tries again, said once until it answers")
                } else {
                    logger.debug("S3 \(method) \(what) failed (\(said))")
                }
                guard retries.triesAgain(afterFailures: tries) else { throw StoreError.unavailable("\(endpoint.url.absoluteString): \(said)") }
            }
            try await Task.sleep(nanoseconds: UInt64(retries.pause(afterFailures: tries) * 1e9))
        }
    }

    /// The service answered (anything): said once after it could not be reached.
    private func reached() {
        if unreachable.load(ordering: .relaxed), unreachable.exchange(false, ordering: .relaxed) {
            logger.notice("S3 \(endpoint.url.absoluteString) answers again")
        }
    }

    private func once(_ method: HTTPMethod, key: String?, query: [(String, String)], headers: [String: String],
                      body: S3Body, maxResponse: Int) async throws -> S3Response {
        let request = prepare(method, key: key, query: query, headers: headers, body: body)
        let response = try await http.execute(request, timeout: timeout)
        if Self.tracing && method != .GET {
            logger.info("S3 trace: \(method) \(key ?? "") \(headers.filter { $0.key.hasPrefix("If-") || $0.key == "x-amz-copy-source" }) -> \(response.status.code)")
        }
        let bytes: ByteBuffer
        do { bytes = try await response.body.collect(upTo: maxResponse) } catch is NIOTooManyBytesError {
            // Not the link's fault, and the same next time: never tried again (a hostile
            // object of 200 MB was fetched again and again, 347 MiB in 10 s).
            throw StoreError.failed("\(method) \(key ?? "the bucket"): the answer is larger than the \(maxResponse) bytes this request takes")
        }
        return S3Response(status: Int(response.status.code), headers: response.headers, body: bytes)
    }

    /// GETs `key` and writes the body into `fd` from `offset` as it arrives (no copy of the
    /// whole in memory); returns the bytes written. Failures are mapped and retried as `send`'s;
    /// a failure to write the local file is thrown at once.
    /// `accept`: whether the answer's headers name the object wanted; when they do not, nothing
    /// is written and the answer counts as a failed precondition (412).
    public func download(key: String, query: [(String, String)] = [], headers: [String: String] = [:],
                         into fd: Int32, at offset: Int64,
                         accept: @Sendable (HTTPHeaders) -> Bool = { _ in true }) async throws -> Int64 {
        try await retrying(.GET, key, query: query) {
            let response = try await http.execute(prepare(.GET, key: key, query: query, headers: headers, body: .none), timeout: timeout)
            let status = Int(response.status.code)
            let asked = headers["Range"].flatMap(Self.byteRange)
            guard status == 200 || status == 206 else {
                let body = try await response.body.collect(upTo: 1 << 20)
                if let wrong = Self.inconsistency(status: status, headers: response.headers, asked: asked, bodyLength: Int64(body.readableBytes)) {
                    return .again(wrong)
                }
                return .answered(S3Response(status: status, headers: response.headers, body: body))
            }
            guard accept(response.headers) else {
                for try await _ in response.body {}  // read to the end, so the connection can serve again
                return .answered(S3Response(status: 412, headers: response.headers, body: ByteBuffer()))
            }
            // A 206 is written only when it says it holds the bytes asked for (else a longer
            // answer would write over the neighbours of the range in `fd`). A 200 to a ranged GET
            // is the whole object (a server may ignore Range): only the bytes asked for are written.
            var skip: Int64 = 0, end: Int64 = .max
            if status == 206 {
                let wrong = Self.inconsistency(status: status, headers: response.headers, asked: asked, bodyLength: nil)
                guard wrong == nil, let (first, last, _) = Self.contentRange(response.headers.first(name: "Content-Range") ?? "") else {
                    for try await _ in response.body {}
                    return .again(wrong ?? "206 without a valid Content-Range")
                }
                end = last - first + 1
            } else if let asked {
                (skip, end) = (asked.lowerBound, asked.upperBound + 1)
            }
            var read: Int64 = 0
            var written: Int64 = 0
            for try await buffer in response.body {
                let from = read
                read += Int64(buffer.readableBytes)
                let lo = max(from, skip), hi = min(read, end)
                guard lo < hi else { continue }
                let data = Data(buffer.readableBytesView.dropFirst(Int(lo - from)).prefix(Int(hi - lo)))
                try LocalWriteError.write(data, to: fd, at: offset + written)
                written += Int64(data.count)
            }
            if let wrong = Self.inconsistency(status: status, headers: response.headers, asked: asked, bodyLength: read) {
                return .again(wrong)
            }
            return .done(written)
        }
    }

    /// The signed request.
    private func prepare(_ method: HTTPMethod, key: String?, query: [(String, String)], headers: [String: String],
                         body: S3Body) -> HTTPClientRequest {
        let path = path(key)
        var host = endpoint.url.host ?? "localhost"
        if let port = endpoint.url.port { host += ":\(port)" }
        var signed = headers
        signed["Host"] = host
        let payloadHash: String
        var request = HTTPClientRequest(url: endpoint.url.absoluteString.trimmingSuffix("/") + path + Self.queryString(query))
        request.method = method
        switch body {
        case .none:
            payloadHash = SigV4.emptyPayloadHash
            if method == .PUT || method == .POST { request.body = .bytes(ByteBuffer()) }
        case .data(let d):
            payloadHash = SigV4.sha256Hex(d)
            request.body = .bytes(ByteBuffer(bytes: d))
        case .file(let fd, let offset, let length, let progress):
            payloadHash = "UNSIGNED-PAYLOAD"
            request.body = .stream(FileChunks(fd: fd, offset: offset, end: offset + length, progress: progress), length: .known(length))
        }
        let c = endpoint.credentials
        let signer = SigV4(accessKey: c.accessKey, secretKey: c.secretKey, sessionToken: c.sessionToken, region: endpoint.region)
        let added = signer.sign(method: method.rawValue, path: path, query: query, headers: signed, payloadHash: payloadHash, date: Date())
        for (k, v) in headers { request.headers.add(name: k, value: v) }
        for (k, v) in added { request.headers.add(name: k, value: v) }
        return request
    }

    static func queryString(_ query: [(String, String)]) -> String {
        if query.isEmpty { return "" }
        // A sub-resource (`?versioning`) goes without `=`; the signature has `versioning=` either way.
        return "?" + query.map { k, v in
            SigV4.uriEncode(k, keepSlash: false) + (v.isEmpty ? "" : "=" + SigV4.uriEncode(v, keepSlash: false))
        }.joined(separator: "&")
    }

    /// S3's error answers as the store's: 404 → notFound, 412 and 409 (a conditional write
    /// that lost a race) → preconditionFailed, 403 → failed (credentials or permissions), 500,
    /// 503 and SlowDown → unavailable (tried again), others → failed. The message is S3's Code.
    static func error(for r: S3Response, key: String, method: HTTPMethod) -> StoreError {
        let code = xmlValue("Code", in: r.text) ?? ""
        switch r.status {
        case 404:
            if code == "NoSuchBucket" { return .failed("no such bucket") }
            return .notFound(key: key)
        case 412:
            return .preconditionFailed(key: key, current: nil)
        case 409 where code != "BucketAlreadyOwnedByYou" && code != "BucketNotEmpty":
            return .preconditionFailed(key: key, current: nil)
        case 403:
            return .failed("access denied (\(code.isEmpty ? "403" : code)): check the credentials and the bucket's permissions")
        case 500, 502, 503, 504:
            return .unavailable("\(r.status) \(code)")
        default:
            if code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" { return .unavailable(code) }
            if code == "EntityTooLarge" || code == "QuotaExceeded" { return .quotaExceeded(key: key) }
            return .failed("\(method) \(key): \(r.status) \(code.isEmpty ? r.text.prefix(200) : Substring(code))")
        }
    }

    static func describe(_ error: Error) -> String {
        // NIO's own text for these is garbled ("connection reset (error set): Connection
        // refused) (errno: 111)"): the system's words, and the number.
        if let e = error as? IOError { return "\(String(cString: strerror(e.errnoCode))) (errno \(e.errnoCode))" }
        if let e = error as? HTTPClientError { return "\(e)" }
        return String(describing: error)
    }
}

/// A file's bytes as the request body: read a MiB at a time as the connection takes them.
struct FileChunks: AsyncSequence, Sendable {
    typealias Element = ByteBuffer
    let fd: Int32
    let offset: Int64
    let end: Int64
    let progress: (@Sendable (Int64) -> Void)?

    struct AsyncIterator: AsyncIteratorProtocol {
        let fd: Int32
        let start: Int64
        var offset: Int64
        let end: Int64
        let progress: (@Sendable (Int64) -> Void)?

        mutating func next() async throws -> ByteBuffer? {
            if offset >= end { return nil }
            let want = Int(Swift.min(1 << 20, end - offset))
            var buffer = ByteBufferAllocator().buffer(capacity: want)
            let at = offset, fd = fd
            let got = try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: want) { raw -> Int in
                var done = 0
                while done < want {
                    let n = pread(fd, raw.baseAddress! + done, want - done, off_t(at) + off_t(done))
                    if n < 0 {
                        if errno == EINTR { continue }
                        throw StoreError.failed("reading the file to upload: \(String(cString: strerror(errno)))")
                    }
                    if n == 0 { throw StoreError.failed("the file to upload got shorter while it was sent") }
                    done += n
                }
                return done
            }
            offset += Int64(got)
            progress?(offset - start)
            return buffer
        }
    }

    func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(fd: fd, start: offset, offset: offset, end: end, progress: progress)
    }
}

extension String {
    func trimmingSuffix(_ suffix: String) -> String { hasSuffix(suffix) ? String(dropLast(suffix.count)) : self }
}

extension S3Client {
    /// Whether the bucket keeps prior versions (versioning Enabled): then versions are S3's
    /// version ids and history is there; otherwise a version is the object's ETag.
    public func bucketKeepsVersions() async throws -> Bool {
        let r = try await send(.GET, key: nil, query: [("versioning", "")])
        return Self.xmlValue("Status", in: r.text) == "Enabled"
    }

    /// Makes the bucket if it is not there. Refused (403) or owned by another account: an error
    /// that says so.
    public func ensureBucket() async throws {
        do {
            try await send(.HEAD, key: nil)
        } catch StoreError.notFound {
            try await send(.PUT, key: nil)
        } catch StoreError.failed(let why) where why == "no such bucket" {
            try await send(.PUT, key: nil)
        }
    }
}
