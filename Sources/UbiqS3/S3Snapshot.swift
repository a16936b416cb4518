import Foundation
import UbiqStore

/// Snapshots of what the bucket's objects are (docs/s3.md): each object's listing stamp with
/// the metadata a HEAD gives, written by a device that knows them all, so that a new device
/// learns them from a few large GETs instead of a HEAD per object.
///
/// - A snapshot is `PREFIX/.ubiquity/s3/snapshot/NAME/`: parts `00000`, `00001`, … of at most
///   `entriesPerPart` JSON lines each, then `done` (`{"format":1,"parts":N,"entries":M}`),
///   written last: a snapshot without it is one being written, or abandoned by a crash. NAME
///   is `TIME-DEVICE-RANDOM` as a log object's, so names sort by time and two devices writing
///   at once write two snapshots (no lock; a reader takes the latest complete one).
/// - An entry is `{"key","stamp","version","size","tag","meta"}`; the stamp is the object's
///   ETag, time and size in a listing. A reader takes an entry only for an object its own
///   listing shows at that very stamp, and only when its version and tag name that ETag: a
///   stale, wrong or hostile entry costs a HEAD, never a wrong file (metadata are read as
///   leniently as a HEAD's).
/// - The latest `kept` complete snapshots stay; older ones, and incomplete ones a day old,
///   are deleted by the device that writes the next.
final class S3Snapshots: @unchecked Sendable {
    static let folder = S3Objects.reserved + "snapshot/"
    /// Entries a part holds at most (tests write smaller parts).
    var entriesPerPart = 10_000
    /// A part larger than this is not read (its objects get a HEAD).
    static let maxPartBytes = 32 << 20
    /// Parts a reader takes of one snapshot at most (a hostile `done` may say anything).
    static let maxParts = 10_000
    /// How far past the server's time a snapshot's name may be (clocks differ a little).
    static let aheadAllowed: Int64 = 10 * 60 * 1000
    static let kept = 2
    static let abandonedAfter: TimeInterval = 86_400
    static let format = 1

    struct Entry: Codable {
        var key: String
        var stamp: String
        var version: String
        var size: Int64
        var tag: String?
        var meta: ObjectMetadata
        /// An object another tool wrote (its metadata are what a HEAD makes of none): the
        /// reader takes it as its own user's.
        var foreign: Bool?

        /// An entry from its line: plainly (`PlainJSON`, `ObjectMetadata.plain`) where it is as
        /// this client writes it, else by JSONDecoder (nil: not an entry).
        static func read(_ line: UnsafeBufferPointer<UInt8>, _ decoder: JSONDecoder) -> Entry? {
            if let o = PlainJSON.parse(line)?.object, let key = o["key"]?.string, let stamp = o["stamp"]?.string,
               let version = o["version"]?.string, let size = o["size"]?.integer(Int64.self),
               let metaObject = o["meta"]?.object, let meta = ObjectMetadata.plain(metaObject) {
                let tag = o["tag"] ?? .null, foreign = o["foreign"] ?? .null
                if tag == .null || tag.string != nil, foreign == .null || foreign == .bool(true) || foreign == .bool(false) {
                    return Entry(key: key, stamp: stamp, version: version, size: size, tag: tag.string, meta: meta,
                                 foreign: foreign == .null ? nil : foreign == .bool(true))
                }
            }
            return try? decoder.decode(Entry.self, from: Data(line))
        }
    }

    struct Done: Codable {
        var format: Int
        var parts: Int
        var entries: Int
    }

    /// A snapshot in the bucket, as its listing shows it.
    struct Found: Equatable {
        var name: String
        var time: Int64
        var parts: [String] = []
        var complete = false
        /// Each of its objects' size ("done" and the parts), where the listing says.
        var sizes: [String: Int] = [:]
    }

    /// What loading a snapshot did.
    struct Loaded {
        var entries = 0
        var unreadable = PassedOver()
        var requests = 0
        /// Parts whose seal did not hold (passed over).
        var unsealed = 0
        /// The part the load stopped before, where it stopped at its bound (nil: it read to
        /// the end, or the snapshot could not be read).
        var next: Int?
    }

    let objects: S3Objects
    /// Seals the parts written here, and checks those read (`BucketSeal`).
    let seal: BucketSeal
    init(objects: S3Objects) { self.objects = objects; seal = objects.seal }

    // MARK: - Reading

    /// The snapshots in the bucket, oldest first (one LIST a thousand objects).
    func all() async throws -> [Found] {
        let folder = objects.prefix + Self.folder
        var byName: [String: Found] = [:]
        var token: String?
        var serverNow: Date?
        repeat {
            var query = [("list-type", "2"), ("prefix", folder), ("max-keys", "1000")]
            if let token { query.append(("continuation-token", token)) }
            let r = try await objects.client.send(.GET, key: nil, query: query)
            serverNow = serverNow ?? r.header("Date").flatMap(S3Time.httpDate)
            for block in S3Client.xmlBlocks("Contents", in: r.text) {
                guard let key = S3Client.xmlValue("Key", in: block), key.hasPrefix(folder) else { continue }
                let rest = key.dropFirst(folder.count).split(separator: "/", omittingEmptySubsequences: false)
                guard rest.count == 2, let time = ChangeLog.time(of: String(rest[0])) else { continue }  // not ours: left alone
                let name = String(rest[0])
                var f = byName[name] ?? Found(name: name, time: time)
                if let size = S3Client.xmlValue("Size", in: block).flatMap({ Int($0) }), size >= 0 { f.sizes[String(rest[1])] = size }
                if rest[1] == "done" { f.complete = true } else if rest[1].utf8.count == 5, rest[1].utf8.allSatisfy({ (48 ... 57).contains($0) }) {
                    f.parts.append(String(rest[1]))
                }
                byName[name] = f
            }
            token = S3Client.xmlValue("IsTruncated", in: r.text) == "true" ? S3Client.xmlValue("NextContinuationToken", in: r.text) : nil
        } while token != nil
        // A snapshot named for a time to come is no device's (a forged "latest" would shadow
        // the real ones for good): passed over.
        let latestTaken = serverNow.map { Int64($0.timeIntervalSince1970 * 1000) + Self.aheadAllowed } ?? .max
        return byName.values.filter { $0.time <= latestTaken }.sorted { ($0.time, $0.name) < ($1.time, $1.name) }
    }

    /// The latest complete snapshot (nil: none), but for those found forged (`forged`).
    func latest() async throws -> Found? {
        let forged = lock.withLock { self.forged }
        return try await all().last { $0.complete && !forged.contains($0.name) }
    }

    /// Snapshots found to hold no sealed part (`load`): passed over from then on, so that a
    /// forged "latest" shadows the real ones for one look only.
    private let lock = NSLock()
    private var forged = Set<String>()

    func noteForged(_ name: String) { lock.withLock { _ = forged.insert(name) } }

    /// Reads `snapshot`'s entries into `index`, part by part (a part at a time in memory),
    /// from part `from` on. Entries that cannot be read are described and passed over; a part
    /// that cannot be fetched ends the load (what was read stays: each entry stands alone).
    /// Parts hold their entries in key order: a load `through` a key stops after the part that
    /// reaches it (a fresh device's first part of the bucket needs the first few parts of a
    /// hundred), and one of `parts` after that many (`Loaded.next` says where it stopped).
    func load(_ snapshot: Found, into index: S3Index, from: Int = 0, through: String? = nil,
              parts partsAtMost: Int = .max) async throws -> Loaded {
        var out = Loaded()
        let base = Self.folder + snapshot.name + "/"
        // A done object that does not read is asked for once more before it is passed over: a
        // busy server has answered with a body that was not the object (seen once in CI).
        var answer = S3Response(status: 0, headers: [:], body: .init())
        var done: Done?
        for _ in 0 ..< 2 where done == nil {
            out.requests += 1
            answer = try await objects.send(.GET, base + "done", headers: ["Range": "bytes=0-4095"], validate: false,
                                            expectedLength: snapshot.sizes["done"].map { min($0, 4096) })
            done = try? JSONDecoder().decode(Done.self, from: answer.data)
        }
        guard let done else {
            let body = String(decoding: answer.data.prefix(40), as: UTF8.self)
            out.unreadable.add("snapshot \(snapshot.name): its done object is not one (HTTP \(answer.status), \(answer.data.count) bytes: \(body.debugDescription))")
            return out
        }
        guard done.format == Self.format else {
            out.unreadable.add("snapshot \(snapshot.name): format \(done.format), which this version does not read"); return out
        }
        let parts = snapshot.parts.sorted().prefix(min(max(0, done.parts), Self.maxParts))
        let decoder = JSONDecoder()
        for (i, part) in parts.enumerated() where i >= from {
            if i - from >= partsAtMost {
                out.next = i
                break
            }
            // An empty part holds nothing (a snapshot of a bucket with nothing settled in it):
            // a ranged GET of it is refused (416), which passed the whole snapshot over.
            if snapshot.sizes[part] == 0 { continue }
            out.requests += 1
            // Its length is known from the listing: a busy server's short answer is asked again.
            let data = try await objects.client.send(.GET, key: objects.prefix + base + part,
                                                     headers: ["Range": "bytes=0-\(Self.maxPartBytes - 1)"],
                                                     maxResponse: Self.maxPartBytes + (64 << 10),
                                                     expectedLength: snapshot.sizes[part].map { min($0, Self.maxPartBytes) }).data
            var good: [(stamp: String, info: ObjectInfo)] = []
            var line = 0
            // A part not sealed with this bucket's key is no device's word: passed over whole,
            // its objects asked of the bucket (a forged snapshot's metadata was shown as the
            // files' own, and its digests failed every read).
            let (body, sealed) = seal.opened(data, name: snapshot.name + "/" + part)
            guard sealed else {
                out.unreadable.add("snapshot \(snapshot.name) part \(part) is not sealed with this bucket's key: passed over (its objects are asked of the bucket)")
                out.unsealed += 1
                continue
            }
            let lines = body.withUnsafeBytes { raw in
                raw.bindMemory(to: UInt8.self).split(separator: 0x0A, omittingEmptySubsequences: true)
                    .map { Entry.read(UnsafeBufferPointer(rebasing: $0), decoder) }
            }
            for e in lines {
                line += 1
                guard let e else {
                    out.unreadable.add("snapshot \(snapshot.name) part \(part), line \(line): not an entry"); continue
                }
                if let why = Self.refusal(e) {
                    out.unreadable.add("snapshot \(snapshot.name) part \(part), line \(line): \(why)"); continue
                }
                var meta = e.meta
                if e.foreign == true {
                    // An object no ubiq device wrote: this user's, as a HEAD here would say.
                    meta.uid = getuid(); meta.gid = getgid()
                }
                if !meta.issues.isEmpty {
                    out.unreadable.add("snapshot \(snapshot.name) part \(part), line \(line): \(e.key.debugDescription)'s metadata read with defaults (\(meta.issues.joined(separator: ", ")))")
                }
                good.append((e.stamp, ObjectInfo(key: e.key, version: e.version, size: e.size, metadata: meta, contentTag: e.tag)))
            }
            try index.remember(good)
            out.entries += good.count
            if let through, let last = lines.last(where: { $0 != nil })??.key, !last.utf8.lexicographicallyPrecedes(through.utf8) {
                if i + 1 < parts.count { out.next = i + 1 }
                break
            }
        }
        return out
    }

    /// Why an entry cannot be taken (nil: it can): a key that is not a name or is the store's
    /// own, or a version, tag or size that is not the object its stamp describes.
    static func refusal(_ e: Entry) -> String? {
        do {
            try StoreKey.validate(e.key)
            if e.key.hasPrefix(S3Objects.reserved) { return "\(e.key.debugDescription) is reserved for the store's own use" }
        } catch {
            return "\(error)"
        }
        let etag = S3Objects.Version(e.version).etag
        guard e.tag == etag, e.stamp.hasPrefix(etag + "|"), e.stamp.hasSuffix("|\(e.size)") else {
            return "the entry for \(e.key.debugDescription) does not describe the object its stamp names"
        }
        return nil
    }

    // MARK: - Writing

    /// Writes a snapshot of `described` (each object's listing and metadata) named for
    /// `time` (ms, the server's clock) and this `device`; returns what it is.
    func write(_ described: [(ListedObject, ObjectInfo)], time: Int64, device: String) async throws -> Found {
        try await write(time: time, device: device) { add in try await add(described) }
    }

    /// Writes a snapshot named for `time` and `device` of what `fill` hands to its `add`, in key
    /// order, a part put as soon as it is full: what is held is a part (a million objects held
    /// whole for one write were 500 MB of a first mount's peak). A write that fails part way
    /// leaves parts without their `done`: no reader takes them, and `prune` deletes them a day on.
    func write(time: Int64, device: String,
               _ fill: (_ add: ([(ListedObject, ObjectInfo)]) async throws -> Void) async throws -> Void) async throws -> Found {
        let name = ChangeLog.name(time: time, device: device)
        let base = Self.folder + name + "/"
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let conditions = objects.checksConditions ? ["If-None-Match": "*"] : [:]
        var found = Found(name: name, time: time)
        var pending: [(ListedObject, ObjectInfo)] = []
        var entries = 0
        func put(_ chunk: ArraySlice<(ListedObject, ObjectInfo)>) async throws {
            var body = Data()
            for (o, i) in chunk {
                body.append(try encoder.encode(Entry(key: o.key, stamp: o.stamp, version: i.version, size: i.size, tag: i.contentTag,
                                                     meta: i.metadata, foreign: Self.isForeign(i) ? true : nil)))
                body.append(0x0A)
            }
            let part = String(format: "%05d", found.parts.count)
            try await objects.send(.PUT, base + part, headers: conditions, body: .data(seal.sealed(body, name: name + "/" + part)), validate: false)
            found.parts.append(part)
            entries += chunk.count
        }
        try await fill { page in
            pending += page
            while pending.count >= entriesPerPart {
                try await put(pending[..<entriesPerPart])
                pending.removeFirst(entriesPerPart)
            }
        }
        if !pending.isEmpty || found.parts.isEmpty { try await put(pending[...]) }
        let done = try encoder.encode(Done(format: Self.format, parts: found.parts.count, entries: entries))
        try await objects.send(.PUT, base + "done", headers: conditions, body: .data(done), validate: false)
        found.complete = true
        return found
    }

    /// Whether `info`'s metadata are those a HEAD here gives an object no ubiq device wrote
    /// (ubiq's own always carry an origin).
    static func isForeign(_ info: ObjectInfo) -> Bool {
        var made = S3Objects.foreign(info.key, modified: nil)
        made.mtimeNs = info.metadata.mtimeNs
        return info.metadata == made
    }

    /// Deletes the snapshots past the latest `kept` complete ones, and incomplete ones older
    /// than `abandonedAfter` before `now` (ms). A delete of an object already gone is no harm.
    func prune(now: Int64) async throws {
        let all = try await all()
        let complete = all.filter(\.complete)
        let keepFrom = complete.count > Self.kept ? complete[complete.count - Self.kept].time : Int64.min
        for s in all {
            let old = s.complete ? s.time < keepFrom : s.time < now - Int64(Self.abandonedAfter * 1000)
            guard old else { continue }
            // `done` first: a reader never takes a snapshot half deleted.
            for part in ["done"] + s.parts {
                try await objects.send(.DELETE, Self.folder + s.name + "/" + part, validate: false)
            }
        }
    }
}
