import Foundation
import UbiqStore

/// AWS Signature Version 4 for S3 requests (header-based, one signed payload hash).
/// https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html
/// Checked against AWS's published examples (Tests/StoreTests/SigV4Tests.swift).
public struct SigV4: Sendable {
    public var accessKey: String
    public var secretKey: String
    /// A temporary credential's token (AWS_SESSION_TOKEN): sent and signed as x-amz-security-token.
    public var sessionToken: String?
    public var region: String
    public var service: String

    public init(accessKey: String, secretKey: String, sessionToken: String? = nil, region: String, service: String = "s3") {
        self.accessKey = accessKey; self.secretKey = secretKey; self.sessionToken = sessionToken
        self.region = region; self.service = service
    }

    /// The SHA-256 of no bytes: the payload hash of a request without a body.
    public static let emptyPayloadHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

    public static func sha256Hex(_ data: some DataProtocol) -> String { SHA256.hex(SHA256.hash(data)) }

    /// Signs a request. `path` is the request's path as sent, already URI-encoded (see
    /// `encodePath`); `query` the decoded query parameters; `headers` those to sign (Host
    /// among them). Returns the headers to add: x-amz-date, x-amz-content-sha256,
    /// x-amz-security-token (with a session token) and Authorization.
    public func sign(method: String, path: String, query: [(String, String)], headers: [String: String],
                     payloadHash: String, date: Date) -> [String: String] {
        let amzDate = Self.amzDate(date)
        let day = String(amzDate.prefix(8))
        var added: [String: String] = ["x-amz-date": amzDate, "x-amz-content-sha256": payloadHash]
        if let sessionToken { added["x-amz-security-token"] = sessionToken }
        var canonical: [String: String] = [:]
        for (name, value) in headers.merging(added, uniquingKeysWith: { a, _ in a }) {
            canonical[name.lowercased()] = Self.trimmed(value)
        }
        let names = canonical.keys.sorted()
        let signedHeaders = names.joined(separator: ";")
        let request = [
            method,
            path.isEmpty ? "/" : path,
            Self.canonicalQuery(query),
            names.map { "\($0):\(canonical[$0]!)\n" }.joined(),
            signedHeaders,
            payloadHash,
        ].joined(separator: "\n")
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let stringToSign = "AWS4-HMAC-SHA256\n\(amzDate)\n\(scope)\n\(Self.sha256Hex(Data(request.utf8)))"
        var key = Array("AWS4\(secretKey)".utf8)
        for part in [day, region, service, "aws4_request"] {
            key = SHA256.hmac(key: key, Array(part.utf8))
        }
        let signature = SHA256.hex(SHA256.hmac(key: key, Array(stringToSign.utf8)))
        added["Authorization"] = "AWS4-HMAC-SHA256 Credential=\(accessKey)/\(scope), SignedHeaders=\(signedHeaders), Signature=\(signature)"
        return added
    }

    /// `20130524T000000Z`.
    public static func amzDate(_ date: Date) -> String {
        var t = time_t(date.timeIntervalSince1970)
        var parts = tm()
        gmtime_r(&t, &parts)
        return String(format: "%04d%02d%02dT%02d%02d%02dZ", parts.tm_year + 1900, parts.tm_mon + 1, parts.tm_mday,
                      parts.tm_hour, parts.tm_min, parts.tm_sec)
    }

    /// URI-encodes as S3 wants: every byte but A–Z a–z 0–9 - . _ ~ (and `/` when `keepSlash`).
    public static func uriEncode(_ s: String, keepSlash: Bool) -> String {
        var out = ""
        out.reserveCapacity(s.utf8.count)
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "A") ... UInt8(ascii: "Z"), UInt8(ascii: "a") ... UInt8(ascii: "z"),
                 UInt8(ascii: "0") ... UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                 UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(b))
            case UInt8(ascii: "/") where keepSlash:
                out.append("/")
            default:
                out += String(format: "%%%02X", b)
            }
        }
        return out
    }

    /// The path of an object (`/bucket/key`), encoded for the request line and the signature.
    public static func encodePath(_ raw: String) -> String { uriEncode(raw, keepSlash: true) }

    static func canonicalQuery(_ query: [(String, String)]) -> String {
        query.map { (uriEncode($0.0, keepSlash: false), uriEncode($0.1, keepSlash: false)) }
            .sorted { $0.0 != $1.0 ? $0.0 < $1.0 : $0.1 < $1.1 }
            .map { "\($0.0)=\($0.1)" }
            .joined(separator: "&")
    }

    /// Leading and trailing spaces dropped, runs of spaces made one.
    static func trimmed(_ value: String) -> String {
        value.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
    }
}
