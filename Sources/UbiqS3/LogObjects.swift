import Foundation
import UbiqStore

/// Where the change log's objects are kept (`S3ChangeLog`): a bucket's, under the store's
/// prefix, or a plain folder (the tests' `FolderLogObjects`), so that the log's own logic (batches, moves
/// held back, reading, pruning) runs the same over either, and its tests run without a server.
/// Paths are relative to the store (`.ubiquity/s3/log/NAME`).
protocol LogObjects: Sendable {
    /// Writes `body` at `path`, never over an object already there where the place can refuse
    /// that (`preconditionFailed`).
    func create(_ path: String, _ body: Data) async throws

    /// The first `atMost` bytes at `path`; `expectedLength` (from a listing): an answer of
    /// another length is the server's failure (transient), never taken.
    func read(_ path: String, atMost: Int, expectedLength: Int?) async throws -> Data

    /// One page (at most 1,000) of the names in `folder` after `after` (a name), in order, with
    /// their sizes where known; `token` continues a page that said there were more.
    func listPage(_ folder: String, after: String, token: String?) async throws -> LogListingPage

    /// Deletes `path` (one already gone is no harm).
    func remove(_ path: String) async throws
}

struct LogListingPage: Sendable {
    var names: [(name: String, size: Int?)] = []
    /// Where the next page begins (nil: this was the last).
    var next: String?
    /// The server's time as its answer said (nil: it did not).
    var date: Date?
}

extension S3Objects: LogObjects {
    func create(_ path: String, _ body: Data) async throws {
        try await send(.PUT, path, headers: checksConditions ? ["If-None-Match": "*"] : [:], body: .data(body), validate: false)
    }

    func read(_ path: String, atMost: Int, expectedLength: Int?) async throws -> Data {
        try await client.send(.GET, key: prefix + path, headers: ["Range": "bytes=0-\(atMost - 1)"],
                              maxResponse: atMost + (64 << 10), expectedLength: expectedLength.map { min($0, atMost) }).data
    }

    func listPage(_ folder: String, after: String, token: String?) async throws -> LogListingPage {
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

    func remove(_ path: String) async throws {
        try await send(.DELETE, path, validate: false)
    }
}
