import Foundation
import Testing
import TestSupport
import UbiqStore
@testable import UbiqS3

@Suite struct S3IndexTests {
    /// A listing is compared with the last one side by side, the last one's rows a few at a time:
    /// the changes are what a plain comparison of the two listings says, round after round,
    /// whatever the page size, with keys that differ only in their Unicode spelling, a listing
    /// out of order and a key listed twice; asked for the cursor alone, it tells nothing and
    /// compares the next listing alike.
    @Test func aListingIsComparedWithTheLastOneInPages() throws {
        let index = try S3Index(path: TempPaths.make("ubiq-s3-index").path)
        // NFC and NFD spellings of one name are two keys (bytes), as are "a" and "a/".
        let keys = (0 ..< 40).map { "d\($0 % 5)/f\($0)" } + ["caf\u{e9}", "cafe\u{301}", "a", "a/", "a/b", "z"]
        var rng = SplitMix(state: 42)
        var model: [KeyBytes: (etag: String, size: Int64)] = [:]
        var cursor: String?
        let taken = Date()
        for round in 0 ..< 16 {
            var next = model
            for key in keys {
                let k = KeyBytes(key)
                switch Int.random(in: 0 ..< 10, using: &rng) {
                case 0, 1: next[k] = next[k] == nil ? ("e\(round)", Int64(round)) : nil
                case 2: if next[k] != nil { next[k] = ("e\(round)-changed", Int64(round)) }
                default: break
                }
            }
            var listing = Listing(taken: Date())
            listing.taken = taken
            listing.objects = next.map { k, v in
                ListedObject(key: k.key, etag: v.etag, size: v.size, modified: taken.addingTimeInterval(-10))
            }.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
            if round % 5 == 3 { listing.objects.shuffle(using: &rng) }
            if round % 4 == 1, let first = listing.objects.first { listing.objects.insert(first, at: 1) }
            // Every third round asks for the cursor alone: no changes told, the table advanced alike.
            let quiet = round % 3 == 2
            let got = try #require(try index.advance(since: cursor, to: listing, pageRows: 1 + round % 4, tell: !quiet))
            var want: [(StoreChange.Kind, KeyBytes)] = []
            for (k, v) in next where cursor == nil || model[k].map({ $0 != v }) ?? true { want.append((.put, k)) }
            if cursor != nil { for k in model.keys where next[k] == nil { want.append((.delete, k)) } }
            want.sort { $0.1 < $1.1 }
            if quiet { want = [] }
            #expect(got.changes.map { "\($0.kind) \($0.key.debugDescription)" } == want.map { "\($0.0) \($0.1.key.debugDescription)" },
                    "round \(round)")
            #expect(got.changes.map { KeyBytes($0.key) } == got.changes.map { KeyBytes($0.key) }.sorted(), "in key order")
            model = next
            cursor = got.cursor
        }
    }
}
