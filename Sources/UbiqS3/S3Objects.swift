import Foundation
import NIOHTTP1
import UbiqStore

/// Objects in an S3 bucket as the store sees them: versions, metadata, conditions. The
/// object operations the S3 store is being built on (the listing, the change feed and
/// multipart uploads are still to come; nothing here is in the CLI yet).
///
/// - A version is the object's ETag in a bucket without versioning, and `VERSIONID ETAG`
///   in one with it: reads are pinned by the version id there, by `If-Match: ETAG` here (a
///   version that is gone is `notFound`, never other bytes). Conditions use the ETag, so two
///   versions with the same bytes (a metadata change) are one to a condition.
/// - Mode, owner, times, link target and xattrs travel in one user-metadata header,
///   `x-amz-meta-ubiq` (base64 JSON); S3 allows 2 KB of user metadata, and a larger set is
///   refused with a clear error.
public struct S3Objects: Sendable {
    public let client: S3Client
    /// Prepended to every key (`photos/`, or empty).
    public let prefix: String
    public let versioned: Bool

    static let metadataHeader = "x-amz-meta-ubiq"
    static let maxMetadataBytes = 2000

    public init(client: S3Client, prefix: String, versioned: Bool) {
        self.client = client
        self.prefix = prefix.isEmpty || prefix.hasSuffix("/") ? prefix : prefix + "/"
        self.versioned = versioned
    }

    struct Version {
        var id: String?
        var etag: String
        init(_ s: String) {
            if let space = s.lastIndex(of: " ") {
                id = String(s[..<space]); etag = String(s[s.index(after: space)...])
            } else {
                id = nil; etag = s
            }
        }
        static func string(id: String?, etag: String) -> String { id.map { "\($0) \(etag)" } ?? etag }
    }

    func info(_ key: String, _ r: S3Response, size: Int64? = nil) throws -> ObjectInfo {
        guard let etag = r.header("ETag") else { throw StoreError.failed("S3 answered for \(key) without an ETag") }
        let id = versioned ? r.header("x-amz-version-id").flatMap { $0 == "null" ? nil : $0 } : nil
        let meta = try r.header(Self.metadataHeader).map(Self.decode) ?? ObjectMetadata(kind: key.hasSuffix("/") ? .directory : .file)
        let length = size ?? r.header("Content-Length").flatMap { Int64($0) } ?? 0
        return ObjectInfo(key: key, version: Version.string(id: id, etag: etag), size: length, metadata: meta, contentTag: etag)
    }

    static func encode(_ m: ObjectMetadata, key: String) throws -> String {
        let text = try JSONEncoder().encode(m).base64EncodedString()
        if text.utf8.count > maxMetadataBytes {
            throw StoreError.failed("\(key): its mode, times and extended attributes take \(text.utf8.count) bytes; S3 keeps at most 2 KB of metadata an object")
        }
        return text
    }

    static func decode(_ text: String) throws -> ObjectMetadata {
        guard let data = Data(base64Encoded: text), let m = try? JSONDecoder().decode(ObjectMetadata.self, from: data) else {
            throw StoreError.failed("unreadable ubiq metadata on an object")
        }
        return m
    }

    static func conditionHeaders(_ c: WriteCondition) -> [String: String] {
        switch c {
        case .always: return [:]
        case .ifAbsent: return ["If-None-Match": "*"]
        case .ifMatch(let v): return ["If-Match": Version(v).etag]
        }
    }

    /// A request about `key` (under the prefix); errors name `key` as the store knows it.
    @discardableResult
    func send(_ method: HTTPMethod, _ key: String, query: [(String, String)] = [], headers: [String: String] = [:],
              body: S3Body = .none) async throws -> S3Response {
        do {
            return try await client.send(method, key: prefix + key, query: query, headers: headers, body: body)
        } catch StoreError.notFound {
            throw StoreError.notFound(key: key)
        } catch StoreError.preconditionFailed(_, let current) {
            throw StoreError.preconditionFailed(key: key, current: current)
        } catch StoreError.quotaExceeded {
            throw StoreError.quotaExceeded(key: key)
        }
    }

    public func head(_ key: String) async throws -> ObjectInfo {
        try StoreKey.validate(key)
        return try info(key, try await send(.HEAD, key))
    }

    /// Bytes `range` of `version` (clamped to the object).
    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        try StoreKey.validate(key)
        if range.isEmpty { return Data() }
        let v = Version(version)
        var query: [(String, String)] = []
        var headers = ["Range": "bytes=\(range.lowerBound)-\(range.upperBound - 1)"]
        if let id = v.id { query.append(("versionId", id)) } else { headers["If-Match"] = v.etag }
        do {
            return try await send(.GET, key, query: query, headers: headers).data
        } catch StoreError.preconditionFailed {
            throw StoreError.notFound(key: key)  // that version is gone
        } catch StoreError.failed(let why) where why.contains(" 416 ") || why.contains("InvalidRange") {
            return Data()  // past the end
        } catch StoreError.failed(let why) where why.contains(" 400 ") && v.id != nil {
            throw StoreError.notFound(key: key)  // an unknown version id
        }
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata, condition: WriteCondition,
                    progress: (@Sendable (Int64) -> Void)? = nil) async throws -> ObjectInfo {
        try StoreKey.validate(key)
        var headers = Self.conditionHeaders(condition)
        headers[Self.metadataHeader] = try Self.encode(metadata, key: key)
        var size: Int64 = 0
        let r: S3Response
        if let source {
            let fd = open(source.path, O_RDONLY | O_CLOEXEC)
            if fd < 0 { throw StoreError.failed("cannot open \(source.path) to upload: \(String(cString: strerror(errno)))") }
            defer { close(fd) }
            var st = stat()
            fstat(fd, &st)
            size = Int64(st.st_size)
            r = try await send(.PUT, key, headers: headers,
                                      body: .file(fd: fd, offset: 0, length: size, progress: progress))
        } else {
            r = try await send(.PUT, key, headers: headers, body: .data(Data()))
        }
        return try info(key, r, size: size).with(metadata)
    }

    /// Server-side copy of `version` of `source` to `destination` (onto itself: new metadata).
    public func copy(from source: String, version: String, to destination: String, metadata: ObjectMetadata?,
                     condition: WriteCondition) async throws -> ObjectInfo {
        try StoreKey.validate(source)
        try StoreKey.validate(destination)
        let v = Version(version)
        let from = try await head(source)
        let meta = metadata ?? from.metadata
        var headers = Self.conditionHeaders(condition)
        var copySource = SigV4.encodePath("/" + client.endpoint.bucket + "/" + prefix + source)
        if let id = v.id { copySource += "?versionId=" + SigV4.uriEncode(id, keepSlash: false) } else {
            headers["x-amz-copy-source-if-match"] = v.etag
        }
        headers["x-amz-copy-source"] = copySource
        headers["x-amz-metadata-directive"] = "REPLACE"
        headers[Self.metadataHeader] = try Self.encode(meta, key: destination)
        let r: S3Response
        do {
            r = try await send(.PUT, destination, headers: headers)
        } catch StoreError.preconditionFailed where v.id == nil {
            // The source's version is gone, or the destination's condition failed: say which.
            if (try? await head(source))?.contentTag != v.etag { throw StoreError.notFound(key: source) }
            throw StoreError.preconditionFailed(key: destination, current: nil)
        }
        // CopyObject answers the new ETag in its body.
        let etag = r.header("ETag") ?? S3Client.xmlValue("ETag", in: r.text).map { $0.hasPrefix("\"") ? $0 : "\"\($0)\"" } ?? from.contentTag ?? ""
        let id = versioned ? r.header("x-amz-version-id") : nil
        return ObjectInfo(key: destination, version: Version.string(id: id, etag: etag), size: from.size, metadata: meta, contentTag: etag)
    }

    /// Deletes `key` if `condition` holds (an absent key with `.always`: fine).
    public func delete(_ key: String, condition: WriteCondition) async throws {
        try StoreKey.validate(key)
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
            guard current.contentTag == Version(version).etag else {
                throw StoreError.preconditionFailed(key: key, current: current.version)
            }
            try await send(.DELETE, key, headers: ["If-Match": Version(version).etag])
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
