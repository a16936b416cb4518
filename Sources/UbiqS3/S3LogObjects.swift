import Foundation
import UbiqStore

/// The bucket holds its change log's objects.
extension S3Objects: LogObjects {
    public func create(_ path: String, _ body: Data) async throws {
        try await send(.PUT, path, headers: checksConditions ? ["If-None-Match": "*"] : [:], body: .data(body), validate: false)
    }

    public func read(_ path: String, atMost: Int, expectedLength: Int?) async throws -> Data {
        try await client.send(.GET, key: prefix + path, headers: ["Range": "bytes=0-\(atMost - 1)"],
                              maxResponse: atMost + (64 << 10), expectedLength: expectedLength.map { min($0, atMost) }).data
    }

    public func listPage(_ folder: String, after: String, token: String?) async throws -> LogListingPage {
        let full = prefix + folder
        var query = [("list-type", "2"), ("prefix", full), ("start-after", full + after), ("max-keys", "1000")]
        if let token { query.append(("continuation-token", token)) }
        let r = try await client.send(.GET, key: nil, query: query)
        var page = LogListingPage(date: r.header("Date").flatMap(S3Time.httpDate))
        for block in S3Client.xmlBlocks("Contents", in: r.text) {
            guard let key = S3Client.xmlValue("Key", in: block), key.hasPrefix(full) else { continue }
            let size = S3Client.xmlValue("Size", in: block).flatMap { Int($0) }.flatMap { $0 >= 0 ? $0 : nil }
            page.names.append((String(key.dropFirst(full.count)), size))
        }
        page.next = S3Client.xmlValue("IsTruncated", in: r.text) == "true" ? S3Client.xmlValue("NextContinuationToken", in: r.text) : nil
        return page
    }

    public func remove(_ path: String) async throws {
        try await send(.DELETE, path, validate: false)
    }
}
