import Foundation

/// Where a change log's objects are kept (`ChangeLog`): any place that can create an object
/// only where none is, read, list in order and delete: a bucket's, under the store's prefix
/// (`S3Objects`), or a plain folder (the tests' `FolderLogObjects`). The log's own logic
/// (batches, moves held back, reading, pruning) runs the same over each, and its tests run
/// without a server. Paths are relative to the store (`.ubiquity/s3/log/NAME` on S3).
public protocol LogObjects: Sendable {
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

public struct LogListingPage: Sendable {
    public var names: [(name: String, size: Int?)] = []
    /// Where the next page begins (nil: this was the last).
    public var next: String?
    /// The server's time as its answer said (nil: it did not).
    public var date: Date?

    public init(names: [(name: String, size: Int?)] = [], next: String? = nil, date: Date? = nil) {
        self.names = names; self.next = next; self.date = date
    }
}

