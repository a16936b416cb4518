import Foundation
import UbiqClock
import NIOHTTP1
import UbiqStore

/// Where part uploads under way are remembered, so that a file sent again after a crash or
/// an outage (same file, same bytes) takes up the parts already sent.
public protocol MultipartJournal: Sendable {
    /// The upload under way for `key`, and the fingerprint of the file it was sending.
    func upload(key: String) -> (id: String, fingerprint: String)?
    func started(key: String, fingerprint: String, uploadID: String)
    func finished(key: String)
}

extension S3Objects {
    /// The largest object CopyObject copies in one request (5 GiB); larger ones go in parts.
    static let maxCopyBytes: Int64 = 5 << 30
    /// Parts sent at once.
    static let partsInFlight = 4

    /// The size of each part of a `size`-byte upload: 16 MiB, more when that would make
    /// over 10,000 parts (S3's limit), in whole MiB.
    static func partSize(for size: Int64) -> Int64 {
        let least = (size + 9_999) / 10_000
        return max(16 << 20, ((least + (1 << 20) - 1) >> 20) << 20)
    }

    /// Sends `size` bytes of `fd` in parts, then completes the upload under `headers`'
    /// condition. A transient failure leaves the upload for the next try (with a journal);
    /// any other failure aborts it.
    func putInParts(_ key: String, fd: Int32, size: Int64, fingerprint: String?, metaText: String,
                    headers: [String: String], progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        let partSize = Self.partSize(for: size)
        let count = Int((size + partSize - 1) / partSize)
        var done: [Int: String] = [:]
        var uploadID: String?
        let journal = fingerprint == nil ? nil : self.journal
        if let (id, was) = journal?.upload(key: key) {
            if was != fingerprint {
                _ = try? await send(.DELETE, key, query: [("uploadId", id)])  // of other bytes: of no use now
            } else if let parts = try? await listParts(key, uploadID: id) {
                uploadID = id
                for p in parts where p.number <= count && p.size == min(partSize, size - Int64(p.number - 1) * partSize) {
                    done[p.number] = p.etag
                }
            }
        }
        if uploadID == nil {
            let r = try await send(.POST, key, query: [("uploads", "")], headers: [Self.metadataHeader: metaText])
            guard let id = S3Client.xmlValue("UploadId", in: r.text) else { throw StoreError.failed("S3 started no part upload for \(key)") }
            uploadID = id
            journal?.started(key: key, fingerprint: fingerprint ?? "", uploadID: id)
        }
        let id = uploadID!
        do {
            let sent = PartProgress(parts: count, already: done.keys.map { min(partSize, size - Int64($0 - 1) * partSize) }, report: progress)
            let todo = (1 ... count).filter { done[$0] == nil }
            try await withThrowingTaskGroup(of: (Int, String).self) { group in
                var next = 0
                func add() {
                    guard next < todo.count else { return }
                    let n = todo[next]
                    next += 1
                    let offset = Int64(n - 1) * partSize, length = min(partSize, size - offset)
                    group.addTask {
                        let r = try await send(.PUT, key, query: [("partNumber", "\(n)"), ("uploadId", id)],
                                               body: .file(fd: fd, offset: offset, length: length,
                                                           progress: { sent.update(n, $0) }))
                        guard let etag = r.header("ETag") else { throw StoreError.failed("S3 took part \(n) of \(key) without an ETag") }
                        return (n, etag)
                    }
                }
                for _ in 0 ..< Self.partsInFlight { add() }
                while let (n, etag) = try await group.next() {
                    done[n] = etag
                    add()
                }
            }
            let body = "<CompleteMultipartUpload>" + (1 ... count).map {
                "<Part><PartNumber>\($0)</PartNumber><ETag>\(done[$0]!)</ETag></Part>"
            }.joined() + "</CompleteMultipartUpload>"
            let r = try await send(.POST, key, query: [("uploadId", id)], headers: headers, body: .data(Data(body.utf8)))
            // CompleteMultipartUpload can fail after answering 200: the error is in the body.
            if r.text.contains("<Error>") {
                let code = S3Client.xmlValue("Code", in: r.text) ?? "error"
                if code == "PreconditionFailed" { throw StoreError.preconditionFailed(key: key, current: nil) }
                throw StoreError.unavailable("completing the part upload of \(key): \(code)")
            }
            journal?.finished(key: key)
            guard let etag = S3Client.xmlValue("ETag", in: r.text).map(Self.quoted) ?? r.header("ETag") else {
                throw StoreError.failed("S3 completed \(key) without an ETag")
            }
            let vid = versioned ? r.header("x-amz-version-id") : nil
            let meta = try await decode(metaText, of: key)
            return ObjectInfo(key: key, version: Version.string(id: vid, etag: etag, metadata: metaText), size: size,
                              metadata: meta, contentTag: etag)
        } catch let e as StoreError where e.isTransient && journal != nil {
            throw e  // the parts sent stay for the next try
        } catch {
            _ = try? await send(.DELETE, key, query: [("uploadId", id)])
            journal?.finished(key: key)
            throw error
        }
    }

    struct Part { var number: Int; var etag: String; var size: Int64 }

    /// The parts the server holds of an upload under way.
    func listParts(_ key: String, uploadID: String) async throws -> [Part] {
        var parts: [Part] = []
        var marker = "0"
        while true {
            let r = try await send(.GET, key, query: [("uploadId", uploadID), ("part-number-marker", marker)])
            for block in S3Client.xmlBlocks("Part", in: r.text) {
                guard let n = S3Client.xmlValue("PartNumber", in: block).flatMap(Int.init),
                      let etag = S3Client.xmlValue("ETag", in: block),
                      let size = S3Client.xmlValue("Size", in: block).flatMap(Int64.init) else { continue }
                parts.append(Part(number: n, etag: Self.quoted(etag), size: size))
            }
            guard S3Client.xmlValue("IsTruncated", in: r.text) == "true",
                  let next = S3Client.xmlValue("NextPartNumberMarker", in: r.text) else { return parts }
            marker = next
        }
    }

    /// A copy of an object over 5 GiB: UploadPartCopy, 1 GiB at a time.
    func copyInParts(from copySource: String, size: Int64, to key: String, metaText: String,
                     headers: [String: String]) async throws -> ObjectInfo {
        let r = try await send(.POST, key, query: [("uploads", "")], headers: [Self.metadataHeader: metaText])
        guard let id = S3Client.xmlValue("UploadId", in: r.text) else { throw StoreError.failed("S3 started no part copy for \(key)") }
        do {
            let partSize: Int64 = 1 << 30
            var etags: [String] = []
            var offset: Int64 = 0, n = 1
            while offset < size {
                let end = min(size, offset + partSize)
                var h = ["x-amz-copy-source": copySource, "x-amz-copy-source-range": "bytes=\(offset)-\(end - 1)"]
                if let m = headers["x-amz-copy-source-if-match"] { h["x-amz-copy-source-if-match"] = m }
                let p = try await send(.PUT, key, query: [("partNumber", "\(n)"), ("uploadId", id)], headers: h)
                guard let etag = S3Client.xmlValue("ETag", in: p.text).map(Self.quoted) else { throw StoreError.failed("S3 copied part \(n) of \(key) without an ETag") }
                etags.append(etag)
                offset = end; n += 1
            }
            let body = "<CompleteMultipartUpload>" + etags.enumerated().map {
                "<Part><PartNumber>\($0.offset + 1)</PartNumber><ETag>\($0.element)</ETag></Part>"
            }.joined() + "</CompleteMultipartUpload>"
            var complete = headers
            complete["x-amz-copy-source-if-match"] = nil
            let c = try await send(.POST, key, query: [("uploadId", id)], headers: complete, body: .data(Data(body.utf8)))
            if c.text.contains("<Error>") { throw StoreError.unavailable("completing the copy to \(key): \(S3Client.xmlValue("Code", in: c.text) ?? "error")") }
            guard let etag = S3Client.xmlValue("ETag", in: c.text).map(Self.quoted) else { throw StoreError.failed("S3 completed \(key) without an ETag") }
            let vid = versioned ? c.header("x-amz-version-id") : nil
            return ObjectInfo(key: key, version: Version.string(id: vid, etag: etag, metadata: metaText), size: size,
                              metadata: try await decode(metaText, of: key), contentTag: etag)
        } catch {
            _ = try? await send(.DELETE, key, query: [("uploadId", id)])
            throw error
        }
    }

    /// Aborts part uploads under the prefix begun more than `age` ago (a crash's leftovers
    /// that were never taken up again); returns how many.
    public func abortStaleUploads(olderThan age: TimeInterval = 24 * 3600) async throws -> Int {
        let r = try await client.send(.GET, key: nil, query: [("prefix", prefix), ("uploads", "")])
        var aborted = 0
        for block in S3Client.xmlBlocks("Upload", in: r.text) {
            guard let key = S3Client.xmlValue("Key", in: block), let id = S3Client.xmlValue("UploadId", in: block),
                  let started = S3Client.xmlValue("Initiated", in: block).flatMap(S3Time.isoDate),
                  time.now.timeIntervalSince(started) > age else { continue }
            _ = try? await client.send(.DELETE, key: key, query: [("uploadId", id)])
            aborted += 1
        }
        return aborted
    }
}

/// Bytes sent of an upload in parts, summed over the parts in flight.
final class PartProgress: @unchecked Sendable {
    private let lock = NSLock()
    private var sent: [Int: Int64] = [:]
    private var base: Int64
    private let report: (@Sendable (Int64) -> Void)?

    init(parts: Int, already: [Int64], report: (@Sendable (Int64) -> Void)?) {
        base = already.reduce(0, +); self.report = report
    }

    func update(_ part: Int, _ bytes: Int64) {
        lock.lock()
        sent[part] = bytes
        let total = base + sent.values.reduce(0, +)
        lock.unlock()
        report?(total)
    }
}

/// S3's two ways of writing a time.
enum S3Time {
    /// `2026-11-23T22:30:15.000Z` (listings), fractions optional.
    static func isoDate(_ s: String) -> Date? {
        let u = Array(s.utf8)
        guard u.count >= 19 else { return nil }
        func num(_ a: Int, _ b: Int) -> Int? { Int(String(decoding: u[a ..< b], as: UTF8.self)) }
        guard let y = num(0, 4), let mo = num(5, 7), let d = num(8, 10), let h = num(11, 13), let mi = num(14, 16),
              let sec = num(17, 19) else { return nil }
        var t = tm()
        t.tm_year = Int32(y - 1900); t.tm_mon = Int32(mo - 1); t.tm_mday = Int32(d)
        t.tm_hour = Int32(h); t.tm_min = Int32(mi); t.tm_sec = Int32(sec)
        var frac = 0.0
        if u.count > 20, u[19] == UInt8(ascii: "."), let end = u[20...].firstIndex(where: { !(48 ... 57).contains($0) }) {
            frac = Double("0." + String(decoding: u[20 ..< end], as: UTF8.self)) ?? 0
        }
        return Date(timeIntervalSince1970: Double(timegm(&t)) + frac)
    }

    /// `Mon, 23 Nov 2026 22:30:15 GMT` (HTTP headers).
    static func httpDate(_ s: String) -> Date? {
        let f = s.split(separator: " ")
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        // Fields in their ranges only: what a server sends may be anything, and a year or a
        // day past Int32 trapped as a field of `tm`.
        guard f.count >= 5, let d = Int(f[1]), (1 ... 31).contains(d), let mo = months.firstIndex(of: String(f[2])),
              let y = Int(f[3]), (1 ... 9999).contains(y) else { return nil }
        let hms = f[4].split(separator: ":").compactMap { Int($0) }
        guard hms.count == 3, (0 ... 23).contains(hms[0]), (0 ... 59).contains(hms[1]), (0 ... 60).contains(hms[2]) else { return nil }
        var t = tm()
        t.tm_year = Int32(y - 1900); t.tm_mon = Int32(mo); t.tm_mday = Int32(d)
        t.tm_hour = Int32(hms[0]); t.tm_min = Int32(hms[1]); t.tm_sec = Int32(hms[2])
        return Date(timeIntervalSince1970: Double(timegm(&t)))
    }
}
