import Foundation
import UbiqClock
import NIOHTTP1
import Synchronization
import UbiqStore

/// Objects in an S3 bucket as the store sees them: versions, metadata, conditions.
///
/// - A version is `ETAG~DIGEST` in a bucket without versioning (the digest names the
///   metadata, so a chmod is a new version too) and `VERSIONID ETAG` in one with it. Reads
///   are pinned by the version id there, by `If-Match: ETAG` here: a version that is gone is
///   `notFound`, never other bytes. Conditions use the ETag: to a condition, two versions
///   with the same bytes (a metadata change) are one.
/// - Mode, owner, times, link target and xattrs travel in one user-metadata header,
///   `x-amz-meta-ubiq` (base64 JSON). S3 keeps 2 KB of user metadata: a larger set goes in
///   an object of its own under `.ubiquity/s3/meta/`, named by its hash (written once, never
///   changed), and the header points to it.
/// - Objects written by other tools have no such header: they show as the mounting user's,
///   mode 0644 (folders 0755), modified when S3 says.
/// - Files of `multipartThreshold` bytes or more go up in parts, several at once; a part
///   upload left by a crash is taken up again when the same file is sent again.
public struct S3Objects: Sendable {
    public let client: S3Client
    /// Prepended to every key (`photos/`, or empty).
    public let prefix: String
    public let versioned: Bool
    /// Whether the server honours `If-None-Match`/`If-Match` on writes. When it does not, a
    /// write checks the current version first (a short window where a race goes unseen).
    public let checksConditions: Bool
    public let multipartThreshold: Int64
    /// Where part uploads under way are remembered (nil: they start over).
    public let journal: (any MultipartJournal)?
    /// Whether the server keeps user metadata on folder markers (`a/b/`). SeaweedFS does not
    /// (it makes them its own directories): there a folder's version is its ETag alone, so a
    /// folder never seems changed by another device only because its metadata is gone.
    public let keepsFolderMetadata: Bool

    static let metadataHeader = "x-amz-meta-ubiq"
    static let maxMetadataBytes = 2000
    /// Keys under this folder (in the prefix) belong to the S3 store itself: never listed.
    public static let reserved = ReservedKeys.root + "s3/"
    /// The bucket's change log (`ChangeLog`).
    public static let logFolder = reserved + "log/"
    /// What each sidecar read turned out to be (`decode`).
    let sidecars = SidecarCache()
    /// Seals what devices write for each other here (`BucketSeal`).
    public var seal: BucketSeal {
        BucketSeal(secret: client.endpoint.credentials.secretKey, bucket: client.endpoint.bucket, prefix: prefix)
    }

    /// This device's time (the server's is told by its answers): when a listing began where the
    /// server does not say, a part upload's age, the log's and snapshots' intervals.
    public let time: any TimeSource

    public init(client: S3Client, prefix: String, versioned: Bool, checksConditions: Bool = true,
                multipartThreshold: Int64 = 64 << 20, journal: (any MultipartJournal)? = nil, keepsFolderMetadata: Bool = true,
                time: any TimeSource = SystemTime()) {
        self.time = time
        self.keepsFolderMetadata = keepsFolderMetadata
        self.client = client
        self.prefix = prefix.isEmpty || prefix.hasSuffix("/") ? prefix : prefix + "/"
        self.versioned = versioned
        self.checksConditions = checksConditions
        self.multipartThreshold = multipartThreshold
        self.journal = journal
    }

    struct Version {
        var id: String?
        var etag: String
        init(_ s: String) {
            if let space = s.lastIndex(of: " ") {
                id = String(s[..<space]); etag = String(s[s.index(after: space)...])
            } else {
                id = nil
                // ETAG~DIGEST: the digest follows the ETag's closing quote.
                let from = s.lastIndex(of: "\"") ?? s.startIndex
                if let tilde = s[from...].lastIndex(of: "~") { etag = String(s[..<tilde]) } else { etag = s }
            }
        }
        static func string(id: String?, etag: String, metadata text: String?) -> String {
            if let id { return "\(id) \(etag)" }
            guard let text else { return etag }
            return etag + "~" + SigV4.sha256Hex(Data(text.utf8)).prefix(12)
        }
    }

    /// The store's view of an answer about `key` (`metaText`: the metadata header as sent).
    func info(_ key: String, _ r: S3Response, size: Int64? = nil, metaText: String? = nil) async throws -> ObjectInfo {
        guard let etag = r.header("ETag") else { throw StoreError.failed("S3 answered for \(key) without an ETag") }
        let id = versioned ? r.header("x-amz-version-id").flatMap { $0 == "null" ? nil : $0 } : nil
        let text = metaText ?? r.header(Self.metadataHeader)
        let meta: ObjectMetadata
        if let text { meta = try await decode(text, of: key) } else {
            meta = Self.foreign(key, modified: r.header("Last-Modified").flatMap(S3Time.httpDate))
        }
        let length = size ?? r.header("Content-Length").flatMap { Int64($0) } ?? 0
        return ObjectInfo(key: key, version: Version.string(id: id, etag: etag, metadata: versioning(text, of: key)), size: length,
                          metadata: meta, contentTag: etag)
    }

    /// The metadata text that names a version of `key` (none for a folder on a server that drops it).
    func versioning(_ text: String?, of key: String) -> String? {
        keepsFolderMetadata || !key.hasSuffix("/") ? text : nil
    }

    /// The metadata of an object another tool wrote.
    static func foreign(_ key: String, modified: Date?) -> ObjectMetadata {
        let dir = key.hasSuffix("/")
        return ObjectMetadata(kind: dir ? .directory : .file, mode: dir ? 0o755 : 0o644, uid: getuid(), gid: getgid(),
                              mtimeNs: modified.map { nanoseconds(sinceEpoch: $0.timeIntervalSince1970) } ?? 0)
    }

    /// The header that carries `m` (writing the sidecar object first when `m` is large).
    func encode(_ m: ObjectMetadata, key: String) async throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys  // one text for one metadata: it names versions and parts
        let json = try encoder.encode(m)
        let text = json.base64EncodedString()
        if text.utf8.count <= Self.maxMetadataBytes { return text }
        let name = SigV4.sha256Hex(json)
        try await send(.PUT, Self.reserved + "meta/" + name, body: .data(json), validate: false)
        return "ref:" + name
    }

    /// The metadata `text` carries. Text that is not ubiq's metadata is read as that of an
    /// object another tool wrote (`ObjectMetadata.issues` says so); only a failure to reach the
    /// store for a sidecar throws.
    func decode(_ text: String, of key: String) async throws -> ObjectMetadata {
        var data: Data?
        if text.hasPrefix("ref:") {
            let name = String(text.dropFirst(4))
            guard name.count == 64, name.allSatisfy(\.isHexDigit) else { return .unreadable(key: key, why: "a bad sidecar name") }
            // A sidecar is named by its bytes' SHA-256: an answer that does not hash to its name
            // is asked for once more (a busy server has answered with a body that was not the
            // object), then read as not ubiq's (a sidecar someone rewrote).
            // Named by its bytes, a sidecar read once is that for good: kept, as is one too large
            // to be metadata (a hostile sidecar of 200 MB was fetched again and again).
            switch sidecars.withLock({ $0[name.lowercased()] }) {
            case .read(let d)?: data = d
            case .refused(let why)?: return .unreadable(key: key, why: why)
            case nil:
                let named = { (d: Data) in SigV4.sha256Hex(d) == name.lowercased() }
                for _ in 0 ..< 2 where !(data.map(named) ?? false) {
                    let answer: S3Response
                    do {
                        answer = try await client.send(.GET, key: prefix + Self.reserved + "meta/" + name,
                                                       headers: ["Range": "bytes=0-\(Self.maxSidecarBytes)"],
                                                       maxResponse: Self.maxSidecarBytes + (64 << 10))
                    } catch StoreError.notFound {
                        return .unreadable(key: key, why: "its sidecar is missing")
                    }
                    if answer.data.count > Self.maxSidecarBytes {
                        let why = "its sidecar is larger than any metadata (over \(Self.maxSidecarBytes) bytes)"
                        remember(sidecar: name, .refused(why))
                        return .unreadable(key: key, why: why)
                    }
                    data = answer.data
                }
                guard let d = data, named(d) else {
                    // Not kept: a busy server has answered with other bytes.
                    return .unreadable(key: key, why: "its sidecar does not hold what its name says")
                }
                remember(sidecar: name, .read(d))
            }
        } else {
            data = Data(base64Encoded: text)
        }
        guard let data else { return .unreadable(key: key, why: "not base64") }
        do { return try ObjectMetadata.read(json: data) } catch {
            return .unreadable(key: key, why: "not ubiq's metadata JSON")
        }
    }

    /// A sidecar as read (by its name), or why it was not taken.
    enum Sidecar: Sendable { case read(Data), refused(String) }

    /// Sidecars by name, shared by the copies of an `S3Objects`.
    final class SidecarCache: Sendable {
        private let kept = Mutex<[String: Sidecar]>([:])
        func withLock<R>(_ body: (inout [String: Sidecar]) -> R) -> R { kept.withLock { body(&$0) } }
    }

    /// Keeps what sidecar `name` turned out to be (at most `sidecarsKept`).
    private func remember(sidecar name: String, _ s: Sidecar) {
        sidecars.withLock {
            if $0.count >= Self.sidecarsKept { $0.removeAll() }
            $0[name.lowercased()] = s
        }
    }

    /// The largest sidecar taken: metadata of the largest xattrs a file can have here (256 KiB,
    /// base64 in JSON) and a link's target come to about 350 KiB.
    static let maxSidecarBytes = 1 << 20
    static let sidecarsKept = 1_000

    static func conditionHeaders(_ c: WriteCondition) -> [String: String] {
        switch c {
        case .always: return [:]
        case .ifAbsent: return ["If-None-Match": "*"]
        case .ifMatch(let v): return ["If-Match": Version(v).etag]
        }
    }

    /// The condition's headers, or, on a server that ignores them, a check of the current
    /// version now (`key`: where the condition applies).
    func conditions(_ c: WriteCondition, at key: String) async throws -> [String: String] {
        if checksConditions { return Self.conditionHeaders(c) }
        switch c {
        case .always: break
        case .ifAbsent:
            if let cur = try? await head(key) { throw StoreError.preconditionFailed(key: key, current: cur.version) }
        case .ifMatch(let v):
            let cur: ObjectInfo
            do { cur = try await head(key) } catch StoreError.notFound { throw StoreError.preconditionFailed(key: key, current: nil) }
            if cur.contentTag != Version(v).etag { throw StoreError.preconditionFailed(key: key, current: cur.version) }
        }
        return [:]
    }

    /// A request about `key` (under the prefix); errors name `key` as the store knows it.
    @discardableResult
    func send(_ method: HTTPMethod, _ key: String, query: [(String, String)] = [], headers: [String: String] = [:],
              body: S3Body = .none, validate: Bool = true, expectedLength: Int? = nil) async throws -> S3Response {
        if validate {
            try StoreKey.validate(key)
            if key.hasPrefix(Self.reserved) { throw StoreError.invalidKey(key, reason: "reserved for the store's own use") }
        }
        do {
            return try await client.send(method, key: prefix + key, query: query, headers: headers, body: body, expectedLength: expectedLength)
        } catch StoreError.notFound {
            throw StoreError.notFound(key: key)
        } catch StoreError.preconditionFailed(_, let current) {
            throw StoreError.preconditionFailed(key: key, current: current)
        } catch StoreError.quotaExceeded {
            throw StoreError.quotaExceeded(key: key)
        }
    }

    public func head(_ key: String) async throws -> ObjectInfo {
        let found = try await info(key, try await send(.HEAD, key))
        if key.hasSuffix("/"), !Self.mayBeMarker(found) { throw StoreError.notFound(key: key) }
        return found
    }

    /// Whether the answer to a HEAD of folder key `a/` may be a marker. SeaweedFS (4.48) keeps
    /// a folder as a directory of its own: a HEAD of `a/` answers for one that holds objects
    /// but has no marker (none was written, or it was deleted) with a made-up object, ETag
    /// `"<md5 of nothing>-0"` (a multipart ETag of no parts, which no object has), and for a
    /// file `a` with that file. Neither is a folder: a renamed folder came back empty from such
    /// an answer (scripts/crash-loop, seed 181133728).
    static func mayBeMarker(_ info: ObjectInfo) -> Bool {
        let etag = (info.contentTag ?? "").trimmingCharacters(in: CharacterSet(charactersIn: "\""))
        if etag.hasSuffix("-0") { return false }
        return info.metadata.kind == .directory && info.size == 0
    }

    /// Whether a listing shows the folder marker `key` (one LIST of one key).
    func listsMarker(_ key: String) async throws -> Bool {
        let query = [("list-type", "2"), ("prefix", prefix + key), ("encoding-type", "url"), ("max-keys", "1")]
        var listed = Listing(taken: time.now)
        _ = parse(try await client.send(.GET, key: nil, query: query).text, into: &listed)
        return listed.objects.first?.key.sameBytes(key) ?? false
    }

    /// One version of `key` by its S3 version id.
    func head(_ key: String, versionID: String) async throws -> ObjectInfo {
        do {
            return try await info(key, try await send(.HEAD, key, query: [("versionId", versionID)]))
        } catch StoreError.failed(let why) where why.contains(" 400 ") || why.contains(" 405 ") {
            throw StoreError.notFound(key: key)  // an unknown version id, or a delete marker
        }
    }

    /// Bytes `range` of `version` (clamped to the object).
    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        let v = Version(version)
        return try await pinned(key, version: version, range: range, empty: Data(), length: { Int64($0.count) }) { query, headers, told in
            let r = try await send(.GET, key, query: query, headers: headers)
            guard Self.serves(v, etag: r.header("ETag"), versionID: r.header("x-amz-version-id")) else {
                throw StoreError.preconditionFailed(key: key, current: nil)
            }
            told.note(r.headers)
            // A 200 is the whole object (a server that ignored Range): the range is cut from it.
            if r.status == 200 {
                let d = r.data
                return d.count <= range.lowerBound ? Data() : Data(d[Int(range.lowerBound) ..< Int(min(Int64(d.count), range.upperBound))])
            }
            return r.data
        }
    }

    /// `read`, written into `fd` at `offset` as the bytes arrive.
    public func read(_ key: String, version: String, range: Range<Int64>, into fd: Int32, at offset: Int64) async throws -> Int64 {
        let v = Version(version)
        return try await pinned(key, version: version, range: range, empty: 0, length: { $0 }) { query, headers, told in
            try await client.download(key: prefix + key, query: query, headers: headers, into: fd, at: offset, accept: {
                told.note($0)
                return Self.serves(v, etag: $0.first(name: "ETag"), versionID: $0.first(name: "x-amz-version-id"))
            })
        }
    }

    /// Whether an answer's headers name `v`: the version id where the bucket has them, else
    /// the ETag. A server that ignored the pin (`If-Match` unheeded, a proxy's stale copy)
    /// sends another version's bytes: they are refused, never mixed into a file.
    static func serves(_ v: Version, etag: String?, versionID: String?) -> Bool {
        if let id = v.id {
            guard let versionID else { return true }  // a server that does not say
            return versionID == id
        }
        guard let etag else { return true }
        return quoted(etag) == quoted(v.etag)
    }

    /// A ranged GET pinned to `version` (by version id, else `If-Match` on the ETag): a version
    /// that is gone is `notFound`, a range past the end is `empty`.
    /// A "not satisfiable" answer that does not say the object's size is taken only when the
    /// version's own size agrees: SeaweedFS under load has answered 416 for a range that starts
    /// inside the object, which taken at its word reads as an empty range. Such an answer is
    /// asked again (`rangeRetries`), then is `unavailable`, never an empty read.
    /// So is an answer shorter than the range where the version's size says there is more:
    /// SeaweedFS under load has answered 200 with no bytes, with headers that agreed (a read
    /// into a file came back with nothing written). A read that reaches past the end costs a HEAD.
    /// `length`: how many bytes a result holds.
    private func pinned<T>(_ key: String, version: String, range: Range<Int64>, empty: T, length: (T) -> Int64,
                           _ get: ([(String, String)], [String: String], Told) async throws -> T) async throws -> T {
        try StoreKey.validate(key)
        if key.hasPrefix(Self.reserved) { throw StoreError.invalidKey(key, reason: "reserved for the store's own use") }
        if range.isEmpty { return empty }
        let v = Version(version)
        var query: [(String, String)] = []
        var headers = ["Range": "bytes=\(range.lowerBound)-\(range.upperBound - 1)"]
        if let id = v.id { query.append(("versionId", id)) } else { headers["If-Match"] = v.etag }
        var tries = 0
        while true {
            tries += 1
            do {
                let told = Told()
                let got = try await get(query, headers, told)
                let n = length(got)
                if n >= Int64(range.count) { return got }
                let size: Int64
                if let said = told.size { size = said } else { size = try await self.size(of: key, v) }
                if n == max(0, min(range.upperBound, size) - range.lowerBound) { return got }  // the object ends there
                let said = "the server answered \(n) of bytes \(range.lowerBound)-\(range.upperBound - 1) of a version of \(size) bytes"
                guard Self.rangeRetries.triesAgain(afterFailures: tries) else { throw StoreError.unavailable("GET \(key): \(said)") }
                client.logger.notice("S3 GET \(key): \(said); trying again")
                try await Task.sleep(nanoseconds: UInt64(Self.rangeRetries.pause(afterFailures: tries) * 1e9))
            } catch StoreError.preconditionFailed, StoreError.notFound {
                throw StoreError.notFound(key: key)  // that version is gone
            } catch StoreError.failed(let why) where why.contains(" 416 ") || why.contains("InvalidRange") {
                let size = try await size(of: key, v)
                if range.lowerBound >= size { return empty }  // past the end
                let said = "the server answered 416 for bytes \(range.lowerBound)- of a version of \(size) bytes"
                guard Self.rangeRetries.triesAgain(afterFailures: tries) else { throw StoreError.unavailable("GET \(key): \(said)") }
                client.logger.notice("S3 GET \(key): \(said); trying again")
                try await Task.sleep(nanoseconds: UInt64(Self.rangeRetries.pause(afterFailures: tries) * 1e9))
            } catch StoreError.failed(let why) where why.contains(" 400 ") && v.id != nil {
                throw StoreError.notFound(key: key)  // an unknown version id
            }
        }
    }

    /// The object's size as an answer's `Content-Range` says it (a 206's `bytes A-B/SIZE`):
    /// a read it ends needs no HEAD to know it reached the end. A 200's body is not taken as
    /// the size (the empty answers above were 200s).
    final class Told: @unchecked Sendable {
        private let lock = NSLock()
        private var said: Int64?
        var size: Int64? { lock.withLock { said } }
        func note(_ headers: HTTPHeaders) {
            guard let range = headers.first(name: "Content-Range"), let (_, _, size) = S3Client.contentRange(range), let size else { return }
            lock.withLock { said = size }
        }
    }

    /// How a ranged GET whose answer contradicts the version's size is asked again: four tries
    /// in all, 0.1, 0.2 and 0.4 s apart.
    static let rangeRetries = RetryPolicy(first: 0.1, tries: 4)

    /// The size of version `v` of `key`, by a HEAD; `notFound` when that version is gone.
    private func size(of key: String, _ v: Version) async throws -> Int64 {
        if let id = v.id { return try await head(key, versionID: id).size }
        let current = try await head(key)
        guard current.contentTag == v.etag else { throw StoreError.notFound(key: key) }
        return current.size
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata, condition: WriteCondition,
                    progress: (@Sendable (Int64) -> Void)? = nil) async throws -> ObjectInfo {
        try StoreKey.validate(key)
        let text = try await encode(metadata, key: key)
        var headers = try await conditions(condition, at: key)
        headers[Self.metadataHeader] = text
        do {
            return try await put(key, source: source, metadata: metadata, text: text, headers: headers, progress: progress)
        } catch StoreError.preconditionFailed(_, nil) {
            throw StoreError.preconditionFailed(key: key, current: try? await head(key).version)
        }
    }

    private func put(_ key: String, source: URL?, metadata: ObjectMetadata, text: String, headers: [String: String],
                     progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        guard let source else {
            let r = try await send(.PUT, key, headers: headers, body: .data(Data()))
            return try await info(key, r, size: 0, metaText: text).with(metadata)
        }
        let fd = open(source.path, O_RDONLY | O_CLOEXEC)
        if fd < 0 { throw StoreError.failed("cannot open \(source.path) to upload: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var st = stat()
        fstat(fd, &st)
        let size = Int64(st.st_size)
        if size >= multipartThreshold {
            // The same bytes again: this device's content generation (in `origin`), same size
            // and metadata. Without an origin nothing says so, and the parts start over.
            let fingerprint = metadata.origin.map { "\(size):\($0):\(text)" }
            return try await putInParts(key, fd: fd, size: size, fingerprint: fingerprint, metaText: text,
                                        headers: headers, progress: progress).with(metadata)
        }
        let r = try await send(.PUT, key, headers: headers, body: .file(fd: fd, offset: 0, length: size, progress: progress))
        return try await info(key, r, size: size, metaText: text).with(metadata)
    }

    /// Server-side copy of `version` of `source` to `destination` (onto itself: new metadata).
    public func copy(from source: String, version: String, to destination: String, metadata: ObjectMetadata?,
                     condition: WriteCondition) async throws -> ObjectInfo {
        try StoreKey.validate(source)
        try StoreKey.validate(destination)
        if source.hasSuffix("/") && destination.hasSuffix("/") {
            // A folder marker has no bytes to copy: it is written anew, with the metadata asked
            // for. (SeaweedFS answers 404 to a copy of the marker of a folder with items in it.)
            var meta = metadata
            if meta == nil { meta = try await head(source).metadata }
            guard let meta else { throw StoreError.notFound(key: source) }
            return try await put(destination, contentsOf: nil, metadata: meta, condition: condition)
        }
        let v = Version(version)
        let from = try await head(source)
        if v.id == nil, from.contentTag != v.etag { throw StoreError.notFound(key: source) }
        // The digest follows the bytes: the source's, when the version read is the one copied.
        let meta = (metadata ?? from.metadata).describing(digest: from.contentTag == v.etag ? from.metadata.sha256 : nil)
        let text = try await encode(meta, key: destination)
        var headers = try await conditions(condition, at: destination)
        var copySource = SigV4.encodePath("/" + client.endpoint.bucket + "/" + prefix + source)
        if let id = v.id { copySource += "?versionId=" + SigV4.uriEncode(id, keepSlash: false) } else {
            headers["x-amz-copy-source-if-match"] = v.etag
        }
        if from.size > Self.maxCopyBytes {
            return try await copyInParts(from: copySource, size: from.size, to: destination, metaText: text, headers: headers).with(meta)
        }
        headers["x-amz-copy-source"] = copySource
        headers["x-amz-metadata-directive"] = "REPLACE"
        headers[Self.metadataHeader] = text
        let r: S3Response
        do {
            r = try await send(.PUT, destination, headers: headers)
        } catch StoreError.preconditionFailed where v.id == nil {
            // The source's version is gone, or the destination's condition failed: say which.
            if (try? await head(source))?.contentTag != v.etag { throw StoreError.notFound(key: source) }
            throw StoreError.preconditionFailed(key: destination, current: try? await head(destination).version)
        } catch StoreError.preconditionFailed(_, nil) {
            throw StoreError.preconditionFailed(key: destination, current: try? await head(destination).version)
        }
        // CopyObject answers the new ETag in its body.
        let etag = S3Client.xmlValue("ETag", in: r.text).map(Self.quoted) ?? r.header("ETag") ?? from.contentTag ?? ""
        let id = versioned ? r.header("x-amz-version-id") : nil
        return ObjectInfo(key: destination, version: Version.string(id: id, etag: etag, metadata: versioning(text, of: destination)), size: from.size,
                          metadata: meta, contentTag: etag)
    }

    static func quoted(_ etag: String) -> String { etag.hasPrefix("\"") ? etag : "\"\(etag)\"" }

    /// Deletes `key` if `condition` holds (an absent key with `.always`: fine).
    public func delete(_ key: String, condition: WriteCondition) async throws {
        try StoreKey.validate(key)
        if !keepsFolderMetadata {
            // SeaweedFS keeps a file `a` and a folder's marker `a/` as one entry of its own: a
            // DELETE of `a/` removes an empty file `a` (its ETag is an empty marker's, so an
            // If-Match does not tell them apart, nor does a HEAD of `a/`, which answers for the
            // file), and a DELETE of `a` removes an empty folder's marker `a/`. A folder renamed
            // away, then an empty file made at its name: the old marker's delete took the file,
            // acknowledged (found by hand on SeaweedFS 4.48, after a file lost in
            // scripts/crash-loop: S3ObjectsTests.aFoldersDeleteLeavesAFileOfItsName). So a
            // marker is deleted only where a listing shows that very key, and a file's key only
            // where a HEAD of it finds one (a marker gone is as good as deleted).
            // (A conditional delete of a file's key sends its HEAD anyway, below: a marker there
            // answers none.)
            if key.hasSuffix("/") {
                if try await !listsMarker(key) {
                    if case .always = condition { return }
                    throw StoreError.notFound(key: key)
                }
            } else if case .always = condition, (try? await head(key)) == nil {
                return
            }
        }
        switch condition {
        case .always:
            try await send(.DELETE, key)
        case .ifAbsent:
            if (try? await head(key)) != nil { throw StoreError.preconditionFailed(key: key, current: nil) }
        case .ifMatch(let version):
            // Checked, then deleted: S3 servers that honour If-Match on DELETE refuse a race;
            // the others leave a short window (documented).
            let current: ObjectInfo
            do { current = try await head(key) } catch StoreError.notFound { throw StoreError.preconditionFailed(key: key, current: nil) }
            // The whole version where it names the metadata too (`ETAG~DIGEST`): every empty
            // file has one ETag, and a delete of one empty file's version took another's, written
            // at that key since. Only a version that is an ETag alone (a folder's marker on a
            // server that keeps no metadata on it, another tool's object) is matched by its ETag.
            let named = !versioned && version.contains("~")
            guard current.version == version || (current.contentTag == Version(version).etag && !versioned && !named) else {
                throw StoreError.preconditionFailed(key: key, current: current.version)
            }
            try await send(.DELETE, key, headers: checksConditions ? ["If-Match": Version(version).etag] : [:])
        }
    }
}

extension ObjectInfo {
    func with(_ metadata: ObjectMetadata) -> ObjectInfo {
        var i = self
        i.metadata = metadata
        return i
    }
}
