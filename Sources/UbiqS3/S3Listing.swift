import Foundation
import UbiqClock
import UbiqStore

/// One object as ListObjectsV2 describes it: no version id, no metadata.
struct ListedObject: Sendable, Equatable {
    var key: String
    var etag: String
    var size: Int64
    var modified: Date?
    /// What tells this object's state from another in a listing: ETag, time, size.
    var stamp: String { "\(etag)|\(modified.map { String(Int64($0.timeIntervalSince1970 * 1000)) } ?? "")|\(size)" }
}

/// A key from a listing that is not a name ubiq can show, and why.
struct SkippedKey: Sendable, Equatable {
    var raw: [UInt8]
    var reason: String
    var shown: String { String(decoding: raw, as: UTF8.self).debugDescription }
}

struct Listing: Sendable {
    var objects: [ListedObject] = []
    var skipped: [SkippedKey] = []
    /// The server's clock when the listing began (its `Date` header), else ours.
    var taken: Date
    var requests = 0
    /// The last key listed, where the listing stopped after its first part (`listAll`'s
    /// `stoppingAfter`): what comes after it in key order was not listed. Nil: listed whole.
    var through: String?
}

extension S3Objects {
    /// Every object whose key (without the store's prefix) starts with `under`, page by page
    /// (1,000 keys a request). Keys that are not valid names (`//`, `.`, `..`, NUL, a segment
    /// over 255 bytes, not UTF-8) are set aside with the reason; the store's own keys are
    /// left out.
    /// `pageSize` keys a request (S3's most); `more` is told once, when the first page says
    /// there is more to list. `stoppingAfter`: the listing ends after the page that brings it
    /// to that many objects (`Listing.through` says where, when there was more).
    func listAll(under: String, pageSize: Int = 1000, stoppingAfter bound: Int = .max,
                 more: () -> Void = {}) async throws -> Listing {
        var out = Listing(taken: time.now)
        var token: String?
        var first = true
        repeat {
            // An unmount ends a listing between two requests (`runBlocking(stopping:)`): a
            // million objects take 1,000.
            try Task.checkCancellation()
            var query = [("list-type", "2"), ("prefix", prefix + under), ("encoding-type", "url"), ("max-keys", "\(pageSize)")]
            if let token { query.append(("continuation-token", token)) }
            let r = try await client.send(.GET, key: nil, query: query)
            out.requests += 1
            if first, let d = r.header("Date").flatMap(S3Time.httpDate) { out.taken = d }
            token = parse(r.text, into: &out)
            if first && token != nil { more() }
            first = false
        } while token != nil && out.objects.count < bound
        out.objects.sort { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
        if token != nil { out.through = out.objects.last?.key ?? "" }
        return out
    }

    /// The files directly in `folder` (a prefix ending in "/", or "" for the top; a delimiter
    /// listing: what is in its sub-folders is not listed) from `first` on, up to `last` or a
    /// little past it, in at most `maxPages` requests. `through`: the last key the listing
    /// reached when it stopped before the folder's end (nil: listed to the end).
    func listFolder(_ folder: String, from first: String, to last: String,
                    maxPages: Int) async throws -> (listing: Listing, through: String?) {
        var out = Listing(taken: time.now)
        var token: String?
        // Just before `first`: the key with its last character dropped (a few keys more at most).
        let before = String(first.dropLast())
        repeat {
            var query = [("list-type", "2"), ("prefix", prefix + folder), ("delimiter", "/"), ("encoding-type", "url"),
                         ("max-keys", "1000")]
            if let token {
                query.append(("continuation-token", token))
            } else if before.utf8.count > folder.utf8.count {
                query.append(("start-after", prefix + before))
            }
            let r = try await client.send(.GET, key: nil, query: query)
            if out.requests == 0, let d = r.header("Date").flatMap(S3Time.httpDate) { out.taken = d }
            out.requests += 1
            token = parse(r.text, into: &out)
        } while token != nil && out.requests < max(1, maxPages)
            && !(out.objects.last.map { !$0.key.utf8.lexicographicallyPrecedes(last.utf8) } ?? false)
        let through = token == nil ? nil : out.objects.max { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }?.key ?? ""
        return (out, through)
    }

    /// Adds one ListObjectsV2 page's objects to `out`; returns the next page's token. Read
    /// on the answer's bytes in one pass (S3XML).
    func parse(_ text: String, into out: inout Listing) -> String? {
        let p = Array(prefix.utf8), reserved = Array(Self.reserved.utf8)
        return S3XML.reading(text) { b in
            let encoded = S3XML.value("EncodingType", in: b) == "url"
            for block in S3XML.elements("Contents", in: b) {
                guard let rawKey = S3XML.value("Key", in: b, within: block) else { continue }
                let bytes = encoded ? Self.percentDecoded(rawKey) : Array(rawKey.utf8)
                guard bytes.starts(with: p) else { continue }
                let rel = Array(bytes[p.count...])
                if rel.starts(with: reserved) { continue }
                guard let key = String(validating: rel, as: UTF8.self) else {
                    out.skipped.append(SkippedKey(raw: rel, reason: "not UTF-8")); continue
                }
                do { try StoreKey.validate(key) } catch {
                    var why = "\(error)"
                    if case StoreError.invalidKey(_, let reason) = error { why = reason }
                    out.skipped.append(SkippedKey(raw: rel, reason: why)); continue
                }
                let etag = S3XML.value("ETag", in: b, within: block).map(Self.quoted) ?? ""
                let size = S3XML.value("Size", in: b, within: block).flatMap(Int64.init) ?? 0
                let modified = S3XML.value("LastModified", in: b, within: block).flatMap(S3Time.isoDate)
                out.objects.append(ListedObject(key: key, etag: etag, size: size, modified: modified))
            }
            return S3XML.value("IsTruncated", in: b) == "true" ? S3XML.value("NextContinuationToken", in: b) : nil
        }
    }

    /// `%XX` sequences as bytes (S3's `encoding-type=url`; `+` is a space there).
    static func percentDecoded(_ s: String) -> [UInt8] {
        var out: [UInt8] = []
        let u = Array(s.utf8)
        var i = 0
        while i < u.count {
            if u[i] == UInt8(ascii: "%"), i + 2 < u.count, let b = UInt8(String(decoding: u[i + 1 ... i + 2], as: UTF8.self), radix: 16) {
                out.append(b); i += 3
            } else if u[i] == UInt8(ascii: "+") {
                out.append(UInt8(ascii: " ")); i += 1
            } else {
                out.append(u[i]); i += 1
            }
        }
        return out
    }

    /// Prior and current versions of `key` (a bucket with versioning), newest first.
    func allVersions(_ key: String) async throws -> [ObjectInfo] {
        try StoreKey.validate(key)
        var ids: [String] = []
        var keyMarker: String?, idMarker: String?
        repeat {
            var query = [("versions", ""), ("prefix", prefix + key)]
            if let keyMarker { query.append(("key-marker", keyMarker)) }
            if let idMarker { query.append(("version-id-marker", idMarker)) }
            let r = try await client.send(.GET, key: nil, query: query)
            for block in S3Client.xmlBlocks("Version", in: r.text) where S3Client.xmlValue("Key", in: block) == prefix + key {
                if let id = S3Client.xmlValue("VersionId", in: block) { ids.append(id) }
            }
            let more = S3Client.xmlValue("IsTruncated", in: r.text) == "true"
            keyMarker = more ? S3Client.xmlValue("NextKeyMarker", in: r.text) : nil
            idMarker = more ? S3Client.xmlValue("NextVersionIdMarker", in: r.text) : nil
        } while keyMarker != nil
        var out: [ObjectInfo] = []
        for id in ids {
            if let v = try? await head(key, versionID: id) { out.append(v) }
        }
        return out
    }
}
