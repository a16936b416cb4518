import Foundation
import UbiqClock

/// A store's change log, kept in the store itself (docs/s3.md: the bucket's): what devices
/// changed, so that another device finds it with one small listing instead of listing the
/// whole store. It needs of its place only what `LogObjects` says, so any store that can list
/// and create an object only where none is can keep one.
///
/// - Each device appends what it wrote and deleted as log objects under its `folder`
///   (`PREFIX/.ubiquity/s3/log/` in a bucket), one object per upload round (at most `entriesPerObject`
///   entries), never rewriting one (`If-None-Match: *` where the server honours it). An object
///   is named `TIME-DEVICE-RANDOM`: TIME in milliseconds by the server's clock (as the device
///   last read it from a `Date` header), 13 digits, so names sort by time.
/// - Each line of a log object is a JSON entry: `{"op":"put"|"delete","key":…,"version":…}`,
///   and for a put what it wrote (`size`, `tag`: the ETag, `meta`) and when (`at`: the
///   server's time in ms as the writer read it when the answer came); or a move,
///   `{"op":"move","from":P,"to":Q,"items":[{"name":N,…what the put wrote}]}`: each key P+N
///   copied to Q+N and deleted, as a put of Q+N and a delete of P+N would say. A move under
///   way waits in the device while the rounds that make it follow one another (`publish`), so
///   a folder's move reaches the log whole, one entry per log object; the deletes of its old
///   keys wait with it (`Entry.deferred`), made just before the log object, so that meanwhile
///   another device still reads what it has not downloaded at the old keys. Entries are hints: the
///   reader asks the store for each key's current state (a HEAD, or one listing of a folder
///   where many of its files changed: `S3Store.confirmed`), so a log object that is wrong,
///   late, duplicated or out of order costs requests, never a wrong file.
/// - A reader lists the log from `window` before its last look (`start-after`) and reads the
///   objects it has not read, its own device's too (a conflict copy this device made must
///   arrive here as well; the feed knows its own writes by their origin). A log object that becomes
///   visible more than `window` after its name's time, one lost, and an object that another tool
///   wrote are all found by the full listing that still runs at its own, slower interval.
/// - Log objects older than the retention are deleted by whichever device lists the bucket.
public final class ChangeLog: @unchecked Sendable {
    /// Where the log objects are (`RESERVED/log/`), and the keys that are the store's own, which
    /// no entry may name.
    public let folder: String
    public let reserved: String
    /// How far before its last look a reader lists the log again.
    public static let window: TimeInterval = 60
    public static let entriesPerObject = 1000
    /// A log object larger than this is not read (its changes are found by the full listing).
    public static let maxObjectBytes = 4 << 20
    /// Entries kept while the store cannot be reached; past it the oldest are dropped (the full
    /// listing finds their changes).
    public static let maxPending = 100_000
    /// A log object that cannot be fetched this many looks in a row is passed over.
    public static let attemptsPerObject = 3
    /// How long a move under way waits for the rest of it at most, and without a change noted
    /// (`publish(holdingMoves:)`); and how many of its entries wait at most (a folder of 10,000
    /// files and its folders: a copy and a delete each).
    public static let moveHold: TimeInterval = 120
    public static let moveQuiet: TimeInterval = 2
    public static let maxHeld = 25_000

    public struct Entry: Codable, Equatable {
        public var op: String
        public var key: String
        public var version: String?
        /// What a put wrote, and the server's time (ms) when its answer came (see above);
        /// nil where the writer does not say (a delete, a write whose answer was lost, large
        /// metadata, an older version's entry).
        public var size: Int64? = nil
        public var tag: String? = nil
        public var meta: ObjectMetadata? = nil
        public var at: Int64? = nil
        /// The write's row in the device's index (`S3Index.unlogged`), forgotten once a log
        /// object holds the entry; not part of the log.
        public var row: Int64? = nil
        /// A put that copied another key to this one: that key (a move's first half, when its
        /// delete follows). In the log only as part of a `move` entry.
        public var from: String? = nil
        /// A delete a move implies that is made only now, just before the log object that
        /// holds it (`settleDeletes`); not part of the log.
        public var deferred = false

        enum CodingKeys: String, CodingKey { case op, key, version, size, tag, meta, at }

        public init(op: String, key: String, version: String?, wrote info: ObjectInfo? = nil, at: Int64? = nil, row: Int64? = nil,
             from: String? = nil, deferred: Bool = false) {
            self.op = op; self.key = key; self.version = version; self.row = row
            self.deferred = op == "delete" && deferred
            self.from = op == "put" && from != key ? from : nil
            if let info, info.key == key, Self.small(info.metadata) {
                size = info.size; tag = info.contentTag; meta = info.metadata; self.at = at
            }
        }

        /// A reader takes an entry's op, key and version, or passes it over; what it says a
        /// put wrote is read only if it reads (a wrong `meta` from a newer or hostile writer
        /// costs the reader a HEAD, not the entry).
        public init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            op = try c.decode(String.self, forKey: .op)
            key = try c.decode(String.self, forKey: .key)
            version = try c.decodeIfPresent(String.self, forKey: .version)
            size = try? c.decodeIfPresent(Int64.self, forKey: .size)
            tag = try? c.decodeIfPresent(String.self, forKey: .tag)
            meta = try? c.decodeIfPresent(ObjectMetadata.self, forKey: .meta)
            at = try? c.decodeIfPresent(Int64.self, forKey: .at)
        }

        /// Metadata small enough to go in every entry (links' targets and xattrs of a few
        /// hundred bytes; larger ones cost the reader a HEAD).
        public static func small(_ m: ObjectMetadata) -> Bool {
            (m.target?.count ?? 0) + m.xattrs.reduce(0) { $0 + $1.key.utf8.count + $1.value.count } <= 1024
        }

        /// What the entry says its put wrote (nil: it does not say, or says what cannot be).
        public var claimed: ObjectInfo? {
            guard op == "put", let version, let size, size >= 0, let meta, at != nil else { return nil }
            return ObjectInfo(key: key, version: version, size: size, metadata: meta, contentTag: tag)
        }
    }

    /// Where each change a look found comes from.
    public struct Note: Equatable {
        /// The entry's `at` (nil: it does not say).
        public var at: Int64?
        /// In a log object of this device's.
        public var mine: Bool
    }

    /// What a look at the log found.
    public struct Read {
        public var changes: [StoreChange] = []
        /// Of each change, in the same order.
        public var notes: [Note] = []
        public var unreadable = PassedOver()
        /// The server's time of the look (the next one lists from `window` before it).
        public var position: Int64 = 0
        public var requests = 0
        /// The log objects read (or passed over), by their time: noted as read by `noteRead`.
        public var logObjects: [String: Int64] = [:]
        /// Whether every log object after `from` was listed and read (not cut short by
        /// `namePages`, nor only marked: `look`).
        public var whole = true
        /// Log objects that did not read, left for the next look.
        public var unreadLeft = 0
        /// Log objects read whose seal did not hold (their entries are hints only).
        public var unsealed = 0
    }

    public let objects: any LogObjects
    /// This device's name in log object names (its S3 index's id).
    public let device: String
    private let lock = NSLock()
    /// Entries noted and not yet written (oldest first), and how many were ever noted.
    private var pending: [Entry] = []
    private var noted = 0
    /// Entries in the log object being written now (one at a time, so they go in order).
    private var inFlight = 0
    private var publishScheduled = false
    /// A move under way (`publish(holdingMoves:)`): its entries (oldest first), the keys its
    /// copies came from whose delete has not come, since when it waits, and when a change was
    /// last noted; and how many publishes that hold nothing back are under way.
    private var held: [Entry] = []
    private var heldSources: Set<String> = []
    private var heldSince: Date?
    private var lastNoted = Date.distantPast
    private var releasing = 0
    /// `moveHold` (tests shorten it).
    public var moveHoldLimit = ChangeLog.moveHold
    /// The server's clock minus this device's, from the last `Date` header read.
    private var clockOffset: TimeInterval = 0
    /// Log objects read (or covered by a full listing) that are still in the window, by their time.
    private var read: [String: Int64] = [:]
    /// Log objects that could not be fetched, and how many times in a row.
    private var failures: [String: Int] = [:]

    /// Told the entries a log object now holds.
    private let logged: @Sendable ([Entry]) -> Void
    /// Makes the deferred deletes (`Entry.deferred`) of a log object's keys, and of `ahead`
    /// (the entries that wait after it), those made earlier taken as they went; returns the
    /// log object's keys whose delete was refused (the key holds another version now: their
    /// entries are not written). Throws when one could not be made (the batch waits for the
    /// next publish).
    public var settleDeletes: @Sendable ([String], _ ahead: [String]) async throws -> Set<String> = { _, _ in [] }
    /// Whether a change noted outside a round goes to the log by itself (tests of a crash
    /// before the log object turn it off).
    public var publishesBySelf = true

    /// What seals this device's log objects, and checks others' (nil: none is sealed, and no
    /// object's claims are taken).
    public let seal: BucketSeal?

    /// This device's time: when a change was noted, how long a move is held, the server's
    /// time as this device reckons it (`serverNow`).
    public let time: any TimeSource

    /// A log in `objects` under `reserved` (the store's own keys: the log is in `reserved/log/`).
    public init(objects: any LogObjects, reserved: String, device: String, seal: BucketSeal?, time: any TimeSource = SystemTime(),
                logged: @escaping @Sendable ([Entry]) -> Void = { _ in }) {
        self.objects = objects; self.reserved = reserved; folder = reserved + "log/"
        self.device = device; self.seal = seal; self.time = time; self.logged = logged
    }

    // MARK: - Writing

    /// Notes a change this device made; it goes to the log at the round's end (`publish`), or
    /// within half a second for a change made outside an upload round. Changes noted while a
    /// round goes on go in few log objects (what half a second brought, or a round's), never one
    /// each: every reader fetches every log object.
    public func record(_ entry: Entry) {
        lock.withLock {
            pending.append(entry)
            noted += 1
            lastNoted = time.now
            if pending.count > Self.maxPending { pending = Self.trimmed(pending, droppingNewest: false) }
        }
        publishSoon()
    }

    /// A publish in half a second (none when one is due already): it holds a move under way
    /// back, and comes again while one waits, so what a round left held goes once it is over.
    private func publishSoon() {
        let schedule = lock.withLock {
            guard !publishScheduled && publishesBySelf else { return false }
            publishScheduled = true
            return true
        }
        guard schedule else { return }
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.5) { [self] in
            lock.withLock { publishScheduled = false }
            Task {
                try? await self.publish(holdingMoves: true)
                if self.lock.withLock({ !self.held.isEmpty }) { self.publishSoon() }
            }
        }
    }

    /// Writes what was noted before the call as log objects (of at most `entriesPerObject`,
    /// a move's delete beside its copy not counted), one at a time; returns when all of it is in
    /// the log, a write another call had under way included. What is noted meanwhile is left
    /// to the next call. What could not be written stays noted for the next call (and throws).
    ///
    /// `holdingMoves` (more upload rounds follow at once): the copies to other keys and the
    /// deletes of their sources wait in the device instead, so that a folder's move goes to the
    /// log whole, as `move` entries, once it is over: at a publish that does not hold, after
    /// `moveHold` seconds, `maxHeld` entries, or `moveQuiet` seconds without a change noted.
    /// They are in the device's index meanwhile, as every entry not yet written is (a crash
    /// loses none of them).
    public func publish(holdingMoves: Bool = false) async throws {
        // Entries leave `pending` in order (to the log, or held back) and are dropped only when
        // too many wait, so every entry noted before the call is written, held or given up once
        // this many are. Held entries go back to the front when released.
        let target = lock.withLock {
            if !holdingMoves { releasing += 1 }
            return noted
        }
        defer { if !holdingMoves { lock.withLock { releasing -= 1 } } }
        while true {
            enum Step { case finished, wait, write([Entry]) }
            let step: Step = lock.withLock {
                // Held entries count as gone from `pending`: one that does not hold writes them
                // (nothing is held anew while it runs: `mayHold`).
                let hold = holdingMoves && mayHold(now: time.now)
                if !hold, !held.isEmpty {
                    if inFlight > 0 { return .wait }
                    releaseHeld()
                }
                if noted - pending.count - inFlight >= target { return .finished }
                if inFlight > 0 { return .wait }
                let b = takeBatch(eligible: pending.count - (noted - target), holding: hold)
                if b.isEmpty { return noted - pending.count >= target ? .finished : .wait }
                inFlight = b.count
                return .write(b)
            }
            switch step {
            case .finished: return
            case .wait: try await Task.sleep(for: .milliseconds(5))
            case .write(var batch):
                do {
                    // A move's deletes first: a reader told of the move finds its old keys gone.
                    let deferred = batch.filter(\.deferred).map(\.key)
                    var refused: [Entry] = []
                    if !deferred.isEmpty {
                        let ahead = lock.withLock { pending.filter(\.deferred).map(\.key) }
                        let no = try await settleDeletes(deferred, ahead)
                        if !no.isEmpty {
                            refused = batch.filter { $0.deferred && no.contains($0.key) }
                            batch.removeAll { $0.deferred && no.contains($0.key) }
                        }
                    }
                    if !batch.isEmpty { try await write(batch) }
                    lock.withLock { inFlight = 0 }
                    logged(batch + refused)
                } catch {
                    lock.withLock {
                        inFlight = 0
                        pending.insert(contentsOf: batch, at: 0)
                        // Too many now: the newest go.
                        if pending.count > Self.maxPending { pending = Self.trimmed(pending, droppingNewest: true) }
                    }
                    throw error
                }
            }
        }
    }

    /// `entries` cut to `maxPending` (the full listing finds the changes of those dropped), the
    /// oldest or the newest dropped first, but never a move's delete that waits (`Entry.deferred`):
    /// its entry is what makes the delete, just before its log object; dropped, the old key
    /// would stay in the store, and every other device would keep the file twice.
    public static func trimmed(_ entries: [Entry], to most: Int = maxPending, droppingNewest: Bool) -> [Entry] {
        var over = entries.count - most
        guard over > 0 else { return entries }
        var drop = Set<Int>()
        for i in droppingNewest ? Array(entries.indices.reversed()) : Array(entries.indices) where over > 0 && !entries[i].deferred {
            drop.insert(i)
            over -= 1
        }
        return entries.indices.filter { !drop.contains($0) }.map { entries[$0] }
    }

    /// Whether a move under way may wait on (under `lock`).
    private func mayHold(now: Date) -> Bool {
        releasing == 0 && held.count < Self.maxHeld && now.timeIntervalSince(lastNoted) < Self.moveQuiet
            && heldSince.map { now.timeIntervalSince($0) < moveHoldLimit } ?? true
    }

    /// Puts what was held back at the front of `pending`, to be written next (under `lock`).
    private func releaseHeld() {
        pending.insert(contentsOf: held, at: 0)
        held = []
        heldSources = []
        heldSince = nil
    }

    /// The next log object's entries, from the first `eligible` of `pending` (under `lock`): up
    /// to `entriesPerObject`, a move's delete beside its copy not counted (the two are one
    /// item of a `move` entry). `holding`: a move's copies and deletes are held back instead.
    private func takeBatch(eligible: Int, holding: Bool) -> [Entry] {
        var batch: [Entry] = []
        var counted = 0
        var taken = 0
        var copiedFrom: Set<String> = []
        while taken < eligible && counted < Self.entriesPerObject {
            let e = pending[taken]
            taken += 1
            if holding {
                if let from = e.from {
                    held.append(e)
                    heldSources.insert(from)
                    if heldSince == nil { heldSince = time.now }
                    continue
                }
                if e.op == "delete", heldSources.remove(e.key) != nil {
                    held.append(e)
                    continue
                }
            }
            batch.append(e)
            if e.op == "delete", copiedFrom.remove(e.key) != nil { continue }
            if let from = e.from { copiedFrom.insert(from) }
            counted += 1
        }
        pending.removeFirst(taken)
        return batch
    }

    /// One log object of `batch`.
    private func write(_ batch: [Entry]) async throws {
        let name = Self.name(time: serverNow(), device: device)
        let lines = try Self.lines(batch)
        try await objects.create(folder + name, seal?.sealed(lines, name: name) ?? lines)
    }

    public static func name(time ms: Int64, device: String) -> String {
        timeText(ms) + "-" + device + "-" + UUID().uuidString.lowercased().prefix(8)
    }

    /// A time as the 13 digits that begin a name.
    public static func timeText(_ ms: Int64) -> String {
        let t = String(max(0, min(ms, 9_999_999_999_999)))
        return String(repeating: "0", count: 13 - t.count) + t
    }

    /// The time in a log object's name (nil: not a log object's name).
    public static func time(of name: String) -> Int64? {
        let parts = name.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].utf8.count == 13, parts[0].utf8.allSatisfy({ (48 ... 57).contains($0) }),
              !parts[1].isEmpty, !parts[2].isEmpty else { return nil }
        return Int64(parts[0])
    }

    /// Now by the server's clock (as last read), in ms.
    public func serverNow() -> Int64 {
        Int64((time.now.timeIntervalSince1970 + lock.withLock { clockOffset }) * 1000)
    }

    // MARK: - Reading

    /// The log objects after `from` (ms) less the window, each of them read unless `markOnly`
    /// (a full listing is about to cover their changes: they are only noted as read) or there
    /// are more than `readingAtMost`; their names listed in `namePages` requests at most. Those
    /// named before `readingFrom` (ms) are only noted as read, as if `markOnly`.
    public func look(from: Int64?, markOnly: Bool, readingAtMost: Int = .max, namePages: Int = .max,
              readingFrom: Int64 = .min) async throws -> Read {
        // This device's own changes first: a look never misses what was done before it (but a
        // move under way, which this device knows of already, goes when it is over).
        if !markOnly { try await publish(holdingMoves: true) }
        var out = Read()
        let start = (from ?? serverNow()) - Int64(Self.window * 1000)
        let listed = try await listNames(after: Self.timeText(start) + "-", pages: namePages, into: &out)
        let fresh: [Listed] = lock.withLock {
            // Forget what fell out of the window: it will not be listed again.
            read = read.filter { $0.value >= start }
            return listed.filter { read[$0.name] == nil }
        }
        let markOnly = markOnly || fresh.lazy.filter { $0.time >= readingFrom }.count > readingAtMost
        if markOnly { out.whole = false }
        // Noted as read only once the caller has what the whole look found (`noteRead`): a
        // look that throws part way, or whose changes the caller could not take, leaves every
        // object to the next one.
        var done: [String: Int64] = [:]
        for (name, time, size) in fresh {
            if markOnly || time < readingFrom {
                done[name] = time
                continue
            }
            // An empty object holds no entry (and a ranged GET of it is refused: 416, which
            // failed the whole look, every poll, and held back every other device's changes).
            if size == 0 {
                done[name] = time
                continue
            }
            let data: Data
            do {
                out.requests += 1
                // Its length is known from the listing (a log object is never rewritten): a
                // busy server's empty answer is asked again, never read as an empty object
                // (its changes were lost until the next full listing).
                data = try await objects.read(folder + name, atMost: Self.maxObjectBytes, expectedLength: size)
            } catch {
                // Gone too (listed, then not there) counts as a failure: an object in the window
                // is younger than any retention, so that is the server's hiccup, not a prune.
                // It is left for the next look (the others are read now: one object that does
                // not read holds back no other change), and passed over after a few.
                let n = lock.withLock { () -> Int in
                    failures[name, default: 0] += 1
                    return failures[name]!
                }
                out.whole = false
                guard n >= Self.attemptsPerObject else {
                    out.unreadLeft += 1
                    continue
                }
                out.unreadable.add("log object \(name): \(error) (\(n) times; its changes are found by the full listing)")
                lock.withLock { failures[name] = nil }
                done[name] = time
                continue
            }
            lock.withLock { failures[name] = nil }
            done[name] = time
            parse(data, of: name, into: &out)
        }
        out.logObjects = done
        return out
    }

    /// Notes the log objects `look` read as read: the next looks in the window pass them over.
    public func noteRead(_ look: Read) {
        lock.withLock { read.merge(look.logObjects) { a, _ in a } }
    }

    /// A log object as a listing shows it: its name, its time, and its size where the listing says.
    typealias Listed = (name: String, time: Int64, size: Int?)

    /// The log objects' names after `after` (their time), in order, up to `pages` thousands;
    /// the position is the server's time of the first answer.
    private func listNames(after: String, pages: Int = .max, into out: inout Read) async throws -> [Listed] {
        var names: [Listed] = []
        var token: String?
        repeat {
            let sent = time.now
            let page = try await objects.listPage(folder, after: after, token: token)
            out.requests += 1
            if out.position == 0 {
                if let d = page.date {
                    // The header is in whole seconds: the middle of that second.
                    let offset = d.timeIntervalSince1970 + 0.5 - sent.timeIntervalSince1970
                    lock.withLock { clockOffset = offset }
                }
                out.position = serverNow()
            }
            for (name, size) in page.names {
                guard let time = Self.time(of: name) else { continue }  // not a log object: left alone
                names.append((name, time, size))
            }
            token = page.next
        } while token != nil && out.requests < pages
        if token != nil { out.whole = false }
        return names
    }

    /// The entries of one log object; what cannot be read is described, and passed over.
    public func parse(_ raw: Data, of name: String, into out: inout Read) {
        // What an object not sealed with this bucket's key says it wrote is not taken: each key
        // it names is asked of the bucket (a forged entry's metadata was shown as the file's).
        let (data, sealed) = seal?.opened(raw, name: name) ?? (raw, false)
        let first = out.changes.count
        defer {
            if !sealed {
                for i in first ..< out.changes.count {
                    out.changes[i].claimed = nil
                    out.notes[i].at = nil
                }
                out.unsealed += 1
            }
        }
        let decoder = JSONDecoder()
        let parts = name.split(separator: "-", omittingEmptySubsequences: false)
        let mine = parts.count == 3 && parts[1] == device
        var lineNumber = 0
        for line in data.split(separator: 0x0A, omittingEmptySubsequences: true) {
            lineNumber += 1
            guard let e = try? decoder.decode(Entry.self, from: Data(line)) else {
                if let m = try? decoder.decode(Move.self, from: Data(line)), m.op == "move" {
                    take(m, of: name, line: lineNumber, mine: mine, into: &out)
                } else {
                    out.unreadable.add("log object \(name), line \(lineNumber): not an entry")
                }
                continue
            }
            let kind: StoreChange.Kind
            switch e.op {
            case "put": kind = .put
            case "delete": kind = .delete
            case "move":
                // A move that also has a key: read as a move, or not at all.
                if let m = try? decoder.decode(Move.self, from: Data(line)) {
                    take(m, of: name, line: lineNumber, mine: mine, into: &out)
                } else {
                    out.unreadable.add("log object \(name), line \(lineNumber): not an entry")
                }
                continue
            default: out.unreadable.add("log object \(name), line \(lineNumber): an operation this version does not know (\(e.op.prefix(40).debugDescription))"); continue
            }
            do {
                try validate(e.key)
            } catch {
                out.unreadable.add("log object \(name), line \(lineNumber): \(error)"); continue
            }
            out.changes.append(StoreChange(kind: kind, key: e.key, version: e.version, claimed: e.claimed))
            out.notes.append(Note(at: e.at, mine: mine))
        }
    }

    /// A key an entry may name: a valid one, not the store's own.
    public func validate(_ key: String) throws {
        try StoreKey.validate(key)
        if key.hasPrefix(reserved) { throw StoreError.invalidKey(key, reason: "reserved for the store's own use") }
    }


    /// Deletes log objects older than `retention` (any device's: a delete of one already gone
    /// is no harm), up to a thousand at a time.
    public func prune(olderThan retention: TimeInterval) async throws {
        let cutoff = serverNow() - Int64(retention * 1000)
        // Names sort by their time, so the listing starts where a log object's name can (names
        // that sort before the digits are passed over unlisted) and goes page after page until
        // it reaches one that stays. Names that are not a log object's are left alone, however
        // many come first: one page of them stopped every prune before (2026-12-07).
        var after = Self.timeText(0)
        for _ in 0 ..< Self.prunePages {
            let page = try await objects.listPage(folder, after: after, token: nil)
            for (name, _) in page.names {
                guard let time = Self.time(of: name) else { continue }
                if time >= cutoff { return }
                try await objects.remove(folder + name)
            }
            guard page.next != nil, let last = page.names.last?.name else { return }
            after = last
        }
    }

    /// Pages of names a prune lists at most (of 1,000 each).
    public static let prunePages = 50
}

/// What a reader of the bucket's own objects (log, snapshots) could not take: the first `kept`
/// descriptions and how many there were in all, as a hostile object may hold millions of bad
/// lines.
public struct PassedOver: Sendable {
    public static let kept = 20
    public private(set) var said: [String] = []
    public private(set) var count = 0

    public init() {}

    public mutating func add(_ what: @autoclosure () -> String) {
        count += 1
        if said.count < Self.kept { said.append(what()) }
    }

    /// The descriptions, and a last line for those not kept.
    public var lines: [String] { count > said.count ? said + ["… and \(count - said.count) more like these"] : said }
}
