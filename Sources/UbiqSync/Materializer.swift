import Foundation
import Logging
import UbiqClock
import UbiqState
import UbiqStore

public enum SyncError: Error, CustomStringConvertible {
    case noRemoteCopy(ino: UInt64)
    case sizeMismatch(key: String, expected: Int64, got: Int64)
    case local(String)
    /// The download was dropped: the item changed in the store or was removed.
    case superseded(ino: UInt64)
    /// A read waited longer than the read timeout for its bytes.
    case timedOut(key: String, seconds: Double)
    /// The bytes the store sent do not have the digest written beside them, in every attempt.
    case digestMismatch(key: String, attempts: Int)
    /// The local disk has no room for the bytes (or only the state database's reserve).
    case noSpace

    public var description: String {
        switch self {
        case .noSpace: return "no room on the local disk for the download"
        case let .digestMismatch(key, n):
            return "\(key): the store's bytes do not match the digest written with them (\(n) downloads); not kept"
        case let .timedOut(key, s): return "\(key): the store did not send the bytes within \(Int(s)) s"
        case .superseded(let ino): return "the download of inode \(ino) was dropped: the item changed in the store"
        case .noRemoteCopy(let ino): return "inode \(ino) has no copy in the store"
        case let .sizeMismatch(key, e, g): return "\(key): store sent \(g) bytes, expected \(e)"
        case .local(let s): return s
        }
    }
}

/// Brings placeholders' bytes from the store into the content cache, lazily.
///
/// One download job per file (a second open joins the first). The job fills
/// the file's cache file (sparse, its true size) chunk by chunk, every chunk
/// from the one store version the placeholder stands for, so a file is never
/// a mix of two versions. A read waits only for the chunks it covers (they
/// jump the queue, with a few chunks of readahead); the rest of the file is
/// completed in the background by parallel fetches. A chunk is marked
/// present only once it is written whole, so no reader sees half a chunk.
///
/// LOCK ORDERING: `cond` is a leaf lock; `onComplete` is called without it.
public final class Materializer: @unchecked Sendable {
    let store: any CloudStore
    let state: LocalState
    let cache: ContentCache
    let logger: Logger
    /// What read timeouts, retries of failed fetches and progress saves go by (the state's).
    var time: any TimeSource { state.time }
    public let chunkSize: Int64
    public let parallelism: Int
    /// Chunks fetched ahead of a read at first; the window doubles with each sequential
    /// read, up to `maxReadahead`, and starts over after a seek.
    public let readahead: Int
    public var maxReadahead = 64
    /// Seconds a read waits for its bytes before it fails (EIO at the mount); the fetch goes on.
    public var readTimeout: TimeInterval = 60
    /// How long a read asks again while the store fails transiently (unreachable, cut short):
    /// long enough to ride out a flaky link, short enough that a store that is down gives EIO
    /// soon (bounded by `readTimeout`).
    public var retryWindow: TimeInterval = 5
    /// Fetch the rest of a file after its first read (false: only what is read).
    public let completeInBackground: Bool
    /// Attempts per chunk before a read fails.
    public let attempts: Int

    private let cond = NSCondition()
    /// Answers waiting reads (`whenLocal`), and their timeouts and retries. A queue of its
    /// own: it gets a thread even while Dispatch's shared pool is busy with blocking work.
    private let answers = DispatchQueue(label: "ubiq.read-answers")
    /// Saves download progress (one at a time, off the fetching threads).
    let saver = DispatchQueue(label: "ubiq.download-progress")
    /// Seconds between saves of a download's progress.
    public var progressInterval: TimeInterval = 5
    private var jobs: [UInt64: Job] = [:]
    /// Why the last download of an item failed, kept once its job is dropped (its reader
    /// closed): `downloading-error` and the `error` status say so until a download of it starts
    /// again or the item changes in the store, or, for a store that could not be reached, until
    /// it answers again (`forgetFailuresOfAStoreAway`).
    private var failures: [UInt64: (why: String, storeAway: Bool)] = [:]
    private var fetched: Int64 = 0
    /// Fetching threads of all downloads together, at most `maxWorkers` (more only for chunks a
    /// reader waits for: a read never queues behind a folder's download).
    public var maxWorkers = 16
    private var running = 0
    /// Downloads that wanted more workers than `maxWorkers` left them, oldest first.
    private var starved: [Job] = []

    /// Content bytes brought from the store since this Materializer started.
    public var bytesFetched: Int64 { cond.lock(); defer { cond.unlock() }; return fetched }
    /// Told of content fetched and thrown away (`attach`), held weakly.
    private weak var sink: (any ContentSink)?
    /// Downloads thrown away because their bytes did not match their digest.
    public var digestMismatches: Int { cond.lock(); defer { cond.unlock() }; return mismatchCount }
    private var mismatchCount = 0
    /// Whole downloads fetched again after a mismatch before reads fail with it.
    public var mismatchAttempts = 3

    /// One file's download. Guarded by `Materializer.cond`.
    final class Job: @unchecked Sendable {
        let ino: UInt64
        /// Where its bytes are read from: the item's key and version, which a move or a change
        /// of metadata elsewhere changes without changing the bytes (`follow`).
        var key: String
        var version: String
        let size: Int64
        let fd: Int32
        var present: [Bool]
        var presentCount = 0
        var inFlight: Set<Int> = []
        var wanted: [Int] = []
        /// Chunks a reader is waiting for: fetched before anything else starts.
        var urgent: Set<Int> = []
        var nextSequential = 0
        /// Where the last read ended, and the readahead window it earned.
        var lastReadEnd: Int64 = -1
        var window = 0
        var workers = 0
        /// The last failure: background and readahead fetching stop until a reader asks again.
        var error: Error?
        /// Chunks whose last fetch failed, with why; a reader asking for one tries it again.
        var failed: [Int: Error] = [:]
        /// Dropped by `cancel`: no more fetching; the last worker closes `fd`.
        var cancelled = false
        /// `fd` was taken to be closed (`closingLocked`): never closed twice.
        var fdTaken = false
        /// Reads waiting for chunks (`whenLocal`).
        var waiters: [Waiter] = []
        /// When progress was last saved, and whether a save is under way.
        var savedAt: Date
        var saving = false
        /// The SHA-256 written beside this version's bytes (nil: nothing to check).
        let expected: String?
        /// The digest of chunks `0 ..< hashedChunks`, taken in order as they arrive, by one
        /// thread at a time (`hashing`).
        var digest = ContentDigest()
        var hashedChunks = 0
        var hashing = false
        /// Whole downloads whose bytes did not match `expected`.
        var mismatches = 0
        /// Once a download was thrown away: the SHA-256 of each fetch of each chunk since. A
        /// chunk is kept only when two fetches of it agree (`confirmLocked`), so one wrong
        /// answer in a file of many chunks no longer costs the whole download again.
        var fetchedSums: [Int: [String]] = [:]
        var done: Bool { presentCount == present.count }
        init(ino: UInt64, key: String, version: String, size: Int64, fd: Int32, chunks: Int, expected: String?, at now: Date) {
            self.ino = ino; self.key = key; self.version = version; self.size = size; self.fd = fd
            savedAt = now
            self.expected = expected
            present = Array(repeating: false, count: chunks)
        }
    }

    public init(store: any CloudStore, state: LocalState, cache: ContentCache, logger: Logger,
                chunkSize: Int64 = 1 << 20, parallelism: Int = 4, readahead: Int = 4,
                completeInBackground: Bool = true, attempts: Int = 3) {
        self.store = store; self.state = state; self.cache = cache; self.logger = logger
        self.chunkSize = chunkSize; self.parallelism = parallelism; self.readahead = readahead
        self.completeInBackground = completeInBackground; self.attempts = attempts
    }

    /// What is told when a file's content is wholly local (`ContentSink.contentArrived`) and
    /// when fetched bytes were thrown away (`contentRejected`). Once, before any download.
    public func attach(sink: any ContentSink) {
        cond.lock(); self.sink = sink; cond.unlock()
    }

    /// Starts (or joins) the download of `ino`; its cache file exists at its full size after this.
    /// `background`: begin fetching the whole file now (download, pin); otherwise fetching
    /// begins with the first read (an open that reads nothing downloads nothing).
    public func start(_ ino: UInt64, background: Bool = true) throws {
        cond.lock()
        if let job = jobs[ino] {
            // Asked again (a download, a pin): a download halted by a failure goes on.
            if background && completeInBackground && job.error != nil && !job.cancelled {
                job.error = nil
                job.failed.removeAll()
                spawnWorkersLocked(job)
            }
            cond.unlock()
            return
        }
        cond.unlock()
        let (entry, rec) = try state.read { tx -> (EntryRecord?, InodeRecord?) in
            (try tx.entries(of: ino).first { $0.remoteKey != nil }, try tx.inode(ino))
        }
        // Completed meanwhile: its completion persisted `present` before the job was dropped.
        if rec?.present == true { return }
        guard let entry, let key = entry.remoteKey, let version = entry.remoteVersion, let rec else {
            throw SyncError.noRemoteCopy(ino: ino)
        }
        guard (0 ... ObjectInfo.maxSize).contains(rec.size) else {
            throw SyncError.local("inode \(ino): a size of \(rec.size) bytes cannot be downloaded")
        }
        // Never size + chunkSize - 1: a size near Int64.max (from anyone's store) would overflow.
        let chunks = Int(rec.size / chunkSize + (rec.size % chunkSize == 0 ? 0 : 1))
        // Chunks an earlier run fetched (and synced) for this same version.
        let saved = try? state.read { try $0.download(ino) }
        let resume = saved.flatMap { s in
            s.version == version && s.chunkSize == chunkSize && s.present.count == chunks
                && cache.size(of: ino) == rec.size ? s.present : nil
        }
        cond.lock()
        defer { cond.unlock() }
        if jobs[ino] != nil { return }
        // Without a record of what is in it, what an earlier run left in the cache file is not trusted.
        let fd = cache.openHeld(ino, flags: O_RDWR | O_CREAT | (resume == nil ? O_TRUNC : 0))
        if fd < 0 { throw SyncError.local("cannot create cache file: \(String(cString: strerror(errno)))") }
        if ftruncate(fd, off_t(rec.size)) != 0 {
            cache.closeHeld(ino, fd)
            throw SyncError.local("cannot size cache file: \(String(cString: strerror(errno)))")
        }
        let job = Job(ino: ino, key: key, version: version, size: rec.size, fd: fd, chunks: chunks,
                      expected: entry.remoteDigest, at: time.now)
        if let resume {
            job.present = resume
            job.presentCount = resume.filter { $0 }.count
        }
        jobs[ino] = job
        failures[ino] = nil
        if job.done && job.expected != nil {
            // Every chunk came in an earlier run, but the whole was never checked: the last is
            // fetched again, and its arrival checks the whole, as for any download.
            job.present[job.present.count - 1] = false
            job.presentCount -= 1
        }
        if job.done { finishLocked(job) } else if completeInBackground && background { spawnWorkersLocked(job) }
    }

    /// Blocks until bytes `range` of `ino` are local (clamped to the file). Throws what
    /// `whenLocal` would answer.
    public func ensure(_ ino: UInt64, range: Range<Int64>) throws {
        try waitForAnswer { (answer: @escaping @Sendable (Result<Void, Error>) -> Void) in
            wait(ino, range: range, inline: true) { e in answer(e.map { .failure($0) } ?? .success(())) }
        }
    }

    /// Calls `done` once bytes `range` of `ino` are local (clamped to the file), or with why
    /// they will not be: the store's answer (gone, changed) at once, its failures once they
    /// went on for `retryWindow`, `timedOut` after `readTimeout` (a later call tries again).
    /// `done` runs on the calling thread when nothing is to be waited for, and otherwise later
    /// on another thread, once the chunk it waits for arrives: no caller waits for the store.
    public func whenLocal(_ ino: UInt64, range: Range<Int64>, _ done: @escaping @Sendable (Error?) -> Void) {
        wait(ino, range: range, inline: false, done)
    }

    /// `inline`: `done` is called with `cond` held, so it must not block (it signals a semaphore).
    private func wait(_ ino: UInt64, range: Range<Int64>, inline: Bool, _ done: @escaping @Sendable (Error?) -> Void) {
        do { try start(ino, background: false) } catch { done(error); return }
        if !register(ino, range: range, inline: inline, done) { done(nil) }
    }

    /// Asks for the chunks of `range` and leaves `done` with the job to be answered, if any is
    /// missing; returns false when all are here already (nothing to wait for).
    private func register(_ ino: UInt64, range: Range<Int64>, inline: Bool,
                          _ done: @escaping @Sendable (Error?) -> Void) -> Bool {
        cond.lock()
        defer { cond.unlock() }
        guard let job = jobs[ino] else { return false }  // already complete
        let upper = min(range.upperBound, job.size)
        if range.lowerBound >= upper { return false }
        let first = Int(range.lowerBound / chunkSize), last = Int((upper - 1) / chunkSize)
        // Once a download of this file was thrown away (its bytes did not match their digest),
        // nothing of it is read until a whole download passes the check: a read waits for all.
        let needed = job.mismatches > 0 ? job.present.indices.filter { !job.present[$0] }
                                        : (first ... last).filter { !job.present[$0] }
        // Sequential reads (this one starts within a chunk of where the last ended) grow the
        // window, also when their bytes are here already (fetched ahead for them).
        if job.lastReadEnd >= 0 && abs(range.lowerBound - job.lastReadEnd) <= chunkSize {
            job.window = min(maxReadahead, max(readahead, job.window * 2))
        } else {
            job.window = readahead
        }
        job.lastReadEnd = upper
        let ahead = (last + 1 ..< min(job.present.count, last + 1 + job.window))
            .filter { !job.present[$0] && !job.inFlight.contains($0) }
        if !needed.isEmpty {
            job.error = nil
            for c in needed { job.failed[c] = nil }
        }
        if !needed.isEmpty || !ahead.isEmpty {
            let front = Set(needed).union(ahead)
            job.wanted = needed + ahead + job.wanted.filter { !front.contains($0) }
            job.urgent.formUnion(needed)
            spawnWorkersLocked(job)
        }
        if needed.isEmpty { return false }
        let w = Waiter(needed: needed, strict: job.mismatches > 0,
                       retryUntil: time.now + min(readTimeout, retryWindow), inline: inline, done: done)
        job.waiters.append(w)
        let timeout = readTimeout
        let timer = DispatchWorkItem { [self] in
            cond.lock()
            answerLocked(job, w, SyncError.timedOut(key: job.key, seconds: timeout))
            cond.unlock()
        }
        w.timer = timer
        time.after(timeout, on: answers, execute: timer)
        settleLocked(job)
        return true
    }

    /// A read waiting for chunks of a job. Guarded by `Materializer.cond`.
    final class Waiter: @unchecked Sendable {
        var needed: [Int]
        /// A download of the file had been thrown away before this read began.
        let strict: Bool
        let retryUntil: Date
        let inline: Bool
        let done: @Sendable (Error?) -> Void
        var retrying = false
        var answered = false
        var timer: DispatchWorkItem?
        init(needed: [Int], strict: Bool, retryUntil: Date, inline: Bool, done: @escaping @Sendable (Error?) -> Void) {
            self.needed = needed; self.strict = strict; self.retryUntil = retryUntil; self.inline = inline; self.done = done
        }
    }

    /// Answers the waiters of `job` whose chunks are here, or failed for good; asks again for
    /// those whose chunks failed in a way that may heal (a cut connection, a timeout), until
    /// their `retryUntil`. Called with `cond` held, after anything about `job` changed.
    private func settleLocked(_ job: Job) {
        for w in job.waiters where !w.answered {
            if !w.strict && job.mismatches > 0 {
                // A download of this file was thrown away meanwhile: this read now waits for a
                // whole one that passes, like every read after it.
                let rest = job.present.indices.filter { !job.present[$0] && !w.needed.contains($0) }
                w.needed += rest
                job.urgent.formUnion(rest)
            }
            let waiting = w.needed.contains { !job.present[$0] }
                || (!w.strict && job.mismatches > 0 && job.present.contains(false))
            if !waiting { answerLocked(job, w, nil); continue }
            // Only a failure of a fetch made for this read counts: one that began before it
            // (while the store was down, say) must not fail a read made once it is back.
            guard let c = w.needed.first(where: { job.failed[$0] != nil }), let e = job.failed[c] else { continue }
            // A store that fails now and then (a cut connection, a timeout) is asked again
            // until the read's deadline; an answer (gone, changed) or a local error is final.
            guard Self.worthRetrying(e), time.now + 0.25 < w.retryUntil, !job.cancelled else {
                answerLocked(job, w, e)
                continue
            }
            if w.retrying { continue }
            w.retrying = true
            time.after(0.25, on: answers, execute: DispatchWorkItem { [self] in
                cond.lock()
                defer { cond.unlock() }
                w.retrying = false
                if !w.answered && !job.cancelled {
                    let again = w.needed.filter { !job.present[$0] && !job.inFlight.contains($0) }
                    for c in again { job.failed[c] = nil }
                    job.error = nil
                    job.wanted = again + job.wanted.filter { !again.contains($0) }
                    job.urgent.formUnion(again)
                    spawnWorkersLocked(job)
                }
                settleLocked(job)
            })
        }
    }

    /// Answers one waiter, once. Called with `cond` held.
    private func answerLocked(_ job: Job, _ w: Waiter, _ error: Error?) {
        guard !w.answered else { return }
        w.answered = true
        w.timer?.cancel()
        w.timer = nil  // it holds the waiter
        job.waiters.removeAll { $0 === w }
        for c in w.needed where job.present[c] || job.failed[c] != nil { job.urgent.remove(c) }
        if w.inline { w.done(error) } else {
            let done = w.done
            answers.async { done(error) }
        }
    }

    /// Answers every read still waiting with `error` (at unmount: nothing waits for a mount
    /// that is gone).
    public func answerAllWaiting(_ error: Error) {
        cond.lock()
        defer { cond.unlock() }
        for job in jobs.values { for w in job.waiters { answerLocked(job, w, error) } }
    }

    /// Whether a failed fetch may succeed if asked again: the store was unreachable, timed
    /// out or cut the answer short. Not: the version is gone, the local disk failed.
    static func worthRetrying(_ e: Error) -> Bool {
        if let s = e as? StoreError { return s.isTransient }
        if let s = e as? SyncError {
            if case .sizeMismatch = s { return true }
            return false
        }
        return !(e is LocalWriteError)
    }

    /// Downloads all of `ino`; returns when it is wholly local.
    public func fetch(_ ino: UInt64) throws {
        try ensure(ino, range: 0 ..< Int64.max)
        cond.lock()
        defer { cond.unlock() }
        // The job is dropped once its completion has recorded the file as local.
        while let job = jobs[ino] {
            if let e = job.error { throw e }
            cond.wait()
            if job.cancelled { throw SyncError.superseded(ino: ino) }
        }
    }

    /// The item `ino` is now `version` of `key` in the store, with the same bytes as `old`,
    /// the version its download reads (moved, or its metadata changed, on another device): the
    /// download goes on from there. A bucket without versions no longer has `old` (a move deletes
    /// it): the download would fail, and so would every read of a chunk not yet here. What failed
    /// is fetched again; the progress is saved again, as of the new version.
    public func follow(_ ino: UInt64, from old: String, to key: String, version: String) {
        cond.lock(); defer { cond.unlock() }
        failures[ino] = nil
        guard let job = jobs[ino], !job.cancelled, job.version == old else { return }
        job.key = key
        job.version = version
        // What is here so far, saved as of the new version: a restart resumes from it.
        if job.presentCount > 0 && !job.done { saveProgressLocked(job) }
        guard job.error != nil || !job.failed.isEmpty else { return }
        let again = Array(job.failed.keys).sorted()
        job.failed.removeAll()
        job.error = nil
        job.wanted = again + job.wanted.filter { !again.contains($0) }
        spawnWorkersLocked(job)
        settleLocked(job)
    }

    /// Drops `ino`'s download (the item changed in the store, or is gone). Fetches under way
    /// finish into the old cache file, which the caller replaces; a waiting reader fails.
    public func cancel(_ ino: UInt64) {
        cond.lock(); defer { cond.unlock() }
        failures[ino] = nil
        guard let job = jobs[ino] else { return }
        jobs[ino] = nil
        job.cancelled = true
        job.error = SyncError.superseded(ino: ino)
        for c in job.present.indices where !job.present[c] { job.failed[c] = job.error }
        if job.workers == 0, let fd = closingLocked(job) { cache.closeHeld(job.ino, fd) }
        cond.broadcast()
        settleLocked(job)
    }

    /// Drops `ino`'s download if nothing was fetched and nothing is being fetched (opened, never read).
    public func cancelIfIdle(_ ino: UInt64) {
        cond.lock(); defer { cond.unlock() }
        guard let job = jobs[ino], job.presentCount == 0, job.inFlight.isEmpty, job.workers == 0,
              job.waiters.isEmpty else { return }
        if let e = job.error { failures[ino] = ("\(e)", Self.storeAway(e)) }
        jobs[ino] = nil
        if let fd = closingLocked(job) { cache.closeHeld(job.ino, fd) }
        cond.broadcast()
    }

    /// If `ino`'s download has every chunk and is only being recorded, waits for that
    /// (at most `timeout` seconds). Returns whether a download is still under way.
    public func settle(_ ino: UInt64, timeout: TimeInterval = 10) -> Bool {
        let deadline = Deadline(in: timeout)
        cond.lock(); defer { cond.unlock() }
        while let job = jobs[ino], job.done, !deadline.passed { deadline.wait(cond) }
        return jobs[ino] != nil
    }

    /// Reads waiting for their bytes, of all files.
    var waitingReads: Int {
        cond.lock(); defer { cond.unlock() }
        return jobs.values.reduce(0) { $0 + $1.waiters.count }
    }

    /// Where `ino`'s download reads from now (nil: no download under way).
    public func source(_ ino: UInt64) -> (key: String, version: String)? {
        cond.lock(); defer { cond.unlock() }
        return jobs[ino].map { ($0.key, $0.version) }
    }

    /// Why `ino`'s download last failed (nil: it has not, or a download of it is under way
    /// again and has not failed yet).
    public func lastError(_ ino: UInt64) -> String? {
        cond.lock(); defer { cond.unlock() }
        if let job = jobs[ino] { return job.error.map { "\($0)" } }
        return failures[ino]?.why
    }

    /// Forgets why downloads failed where the store could not be reached (a read while
    /// offline): it answers again, and the next read tries again anyway. A laptop that read a
    /// file offline is not left saying `error` for good. Returns the items it forgot.
    public func forgetFailuresOfAStoreAway() -> [UInt64] {
        cond.lock(); defer { cond.unlock() }
        var forgot: [UInt64] = []
        for (ino, f) in failures where f.storeAway {
            failures[ino] = nil
            forgot.append(ino)
        }
        // A download halted by such a failure goes on, as when it is asked again (`start`).
        for (ino, job) in jobs {
            guard let e = job.error, Self.storeAway(e), !job.cancelled else { continue }
            job.error = nil
            job.failed.removeAll()
            if completeInBackground { spawnWorkersLocked(job) }
            forgot.append(ino)
        }
        return forgot
    }

    /// A failure that says the store could not be reached (as opposed to an answer: gone,
    /// changed, bytes that do not match).
    static func storeAway(_ e: Error) -> Bool { (e as? StoreError)?.isTransient == true }

    /// Items with a download under way, or whose last download failed (`lastError`).
    public func downloadsAndFailures() -> Set<UInt64> {
        cond.lock(); defer { cond.unlock() }
        return Set(jobs.keys).union(failures.keys)
    }

    /// Each download under way and how far it got (`localBytes`).
    public func downloadedSoFar() -> [(ino: UInt64, bytes: Int64)] {
        cond.lock(); defer { cond.unlock() }
        return jobs.map { (ino, job) in (ino, fetchedBytes(job)) }
    }

    /// How much of `job`'s file is local: its chunks fetched so far (under `cond`).
    private func fetchedBytes(_ job: Job) -> Int64 { min(job.size, Int64(job.presentCount) * chunkSize) }

    /// Bytes of `ino` already local, while it is downloading (nil: no download under way).
    public func localBytes(_ ino: UInt64) -> Int64? {
        cond.lock(); defer { cond.unlock() }
        guard let job = jobs[ino] else { return nil }
        return fetchedBytes(job)
    }

    // MARK: - Workers (under `cond` unless noted)

    private func spawnWorkersLocked(_ job: Job) {
        // While a reader waits, only its chunks are fetched (no competition for its first byte);
        // once they are here, the workers ramp up to `parallelism`.
        let waiting = job.urgent.filter { !job.present[$0] }.count
        let limit = waiting > 0 ? min(parallelism, waiting) : parallelism
        while job.workers < limit && nextChunkAvailable(job) {
            if running >= maxWorkers && !job.urgent.contains(where: { urgentAvailable(job, $0) }) {
                if !starved.contains(where: { $0 === job }) { starved.append(job) }
                return
            }
            job.workers += 1
            running += 1
            let t = Thread { [self] in work(job) }
            t.name = "ubiq-download"
            t.start()
        }
    }

    /// A worker ended: downloads that waited for one get it, oldest first.
    private func workerEndedLocked() {
        running -= 1
        while running < maxWorkers, !starved.isEmpty {
            let next = starved.removeFirst()
            if !next.cancelled && jobs[next.ino] === next { spawnWorkersLocked(next) }
        }
    }

    private func nextChunkAvailable(_ job: Job) -> Bool {
        if job.error != nil { return job.urgent.contains { urgentAvailable(job, $0) } }
        if job.wanted.contains(where: { !job.present[$0] && !job.inFlight.contains($0) }) { return true }
        guard completeInBackground else { return false }
        var i = job.nextSequential
        while i < job.present.count && (job.present[i] || job.inFlight.contains(i)) { i += 1 }
        if i < job.present.count { return true }
        // A chunk passed over earlier (its fetch failed): what `takeChunk` falls back to.
        return job.present.indices.contains { !job.present[$0] && !job.inFlight.contains($0) }
    }

    private func urgentAvailable(_ job: Job, _ c: Int) -> Bool {
        !job.present[c] && !job.inFlight.contains(c) && job.failed[c] == nil
    }

    /// The next chunk to fetch. After a failure, only chunks a reader waits for.
    private func takeChunk(_ job: Job) -> Int? {
        if job.cancelled { return nil }
        if job.error != nil {
            guard let c = job.urgent.sorted().first(where: { urgentAvailable(job, $0) }) else { return nil }
            job.inFlight.insert(c)
            return c
        }
        while let c = job.wanted.first {
            job.wanted.removeFirst()
            if !job.present[c] && !job.inFlight.contains(c) { job.inFlight.insert(c); return c }
        }
        guard completeInBackground else { return nil }
        while job.nextSequential < job.present.count {
            let c = job.nextSequential
            job.nextSequential += 1
            if !job.present[c] && !job.inFlight.contains(c) { job.inFlight.insert(c); return c }
        }
        // Chunks skipped while in flight elsewhere and later released after a failure.
        if let c = job.present.indices.first(where: { !job.present[$0] && !job.inFlight.contains($0) }) {
            job.inFlight.insert(c)
            return c
        }
        return nil
    }

    private func work(_ job: Job) {
        cond.lock()
        while let chunk = takeChunk(job) {
            let confirming = job.mismatches > 0
            let from = (job.key, job.version)
            cond.unlock()
            let result = fetchChunk(job, chunk, key: from.0, version: from.1)
            var sum: String?
            if confirming, case .success = result { sum = chunkDigest(job, chunk) }
            cond.lock()
            job.inFlight.remove(chunk)
            if let sum, !confirmLocked(job, chunk, sum) {
                job.wanted.insert(chunk, at: 0)  // fetched again before anything else
                continue
            }
            switch result {
            case .success where job.expected != nil && job.presentCount + 1 == job.present.count:
                // The chunk that completes the file: the whole is checked before a reader
                // sees this chunk (a file of one chunk is never read unchecked).
                if verifyLocked(job, completing: chunk) { arrivedLocked(job, chunk) }
            case .success:
                arrivedLocked(job, chunk)
                hashArrivedLocked(job)
            case .failure where (job.key, job.version) != from:
                job.wanted.insert(chunk, at: 0)  // the item moved meanwhile (`follow`): fetched from where it is now
                continue
            case .failure(let e):
                job.error = e
                job.failed[chunk] = e
                logger.warning("download of \(job.key) failed: \(e)")
            }
            cond.broadcast()
            settleLocked(job)
        }
        job.workers -= 1
        workerEndedLocked()
        if job.cancelled {
            if job.workers == 0, let fd = closingLocked(job) { cache.closeHeld(job.ino, fd) }
            cond.broadcast()
            cond.unlock()
            return
        }
        let finished = job.done && job.workers == 0 && jobs[job.ino] === job
        // Taken here, under the lock: a cancel before the job is dropped below leaves it alone.
        let fd = finished ? closingLocked(job) : nil
        let sink = self.sink, version = job.version
        cond.broadcast()
        cond.unlock()
        if finished {
            if let fd {
                _ = fsync(fd)
                cache.closeHeld(job.ino, fd)
            }
            sink?.contentArrived(job.ino, version: version)  // persists `present` before the job is dropped (see `start`)
            try? state.write { try $0.removeDownload(job.ino, version: version) }
            cond.lock()
            if jobs[job.ino] === job { jobs[job.ino] = nil }
            cond.broadcast()
            cond.unlock()
        }
    }

    private func arrivedLocked(_ job: Job, _ chunk: Int) {
        job.present[chunk] = true
        job.presentCount += 1
        job.urgent.remove(chunk)
        fetched += min(chunkSize, job.size - Int64(chunk) * chunkSize)
        spawnWorkersLocked(job)
        if !job.done && !job.saving && time.now.timeIntervalSince(job.savedAt) >= progressInterval {
            saveProgressLocked(job)
        }
    }

    /// Adds the chunks that arrived in order to the job's digest (reading them back from the
    /// cache file, where they are in the page cache still), so checking the whole at the end
    /// costs about one chunk. Called with `cond` held; drops it while hashing.
    private func hashArrivedLocked(_ job: Job, including held: Int? = nil) {
        guard job.expected != nil, !job.hashing else { return }
        job.hashing = true
        while job.hashedChunks < job.present.count, !job.cancelled,
              job.present[job.hashedChunks] || job.hashedChunks == held {
            let c = job.hashedChunks
            let range = Int64(c) * chunkSize ..< min(job.size, Int64(c + 1) * chunkSize)
            cond.unlock()
            let ok = job.digest.add(job.fd, range)
            cond.lock()
            if !ok { break }
            job.hashedChunks += 1
        }
        job.hashing = false
        cond.broadcast()
    }

    /// Checks the whole file, `chunk` (just fetched, not yet marked present) included, against
    /// its digest. A mismatch throws every chunk away and fetches them again, up to
    /// `mismatchAttempts` times; after that the reads waiting for it fail. Called with `cond` held.
    private func verifyLocked(_ job: Job, completing chunk: Int) -> Bool {
        job.inFlight.insert(chunk)  // no other worker takes it while it is checked
        while job.hashing { cond.wait() }
        hashArrivedLocked(job, including: chunk)
        job.inFlight.remove(chunk)
        if job.cancelled { return false }
        let got = job.hashedChunks == job.present.count ? job.digest.hex() : "unreadable"
        let sink = self.sink, ino = job.ino
        if got == job.expected {
            // Pages of an attempt thrown away may have reached the kernel's cache after it was
            // dropped (a read under way then): dropped again, now that the bytes are right.
            if job.mismatches > 0 { DispatchQueue.global().async { sink?.contentRejected(ino) } }
            return true
        }
        job.mismatches += 1
        mismatchCount += 1
        let e = SyncError.digestMismatch(key: job.key, attempts: job.mismatches)
        logger.error("download of \(job.key) (version \(job.version)) thrown away: its bytes have SHA-256 \(got), not \(job.expected ?? "")")
        for c in job.present.indices { job.present[c] = false }
        job.presentCount = 0
        job.nextSequential = 0  // the background fetch starts over
        job.hashedChunks = 0
        job.digest = ContentDigest()
        if job.mismatches >= mismatchAttempts {
            job.error = e
            for c in job.urgent.union([chunk]) { job.failed[c] = e }
        } else {
            // All of it again, what readers wait for first (also when nothing downloads in the background).
            let first = job.urgent.union([chunk]).sorted()
            job.wanted = first + job.present.indices.filter { !first.contains($0) }
            spawnWorkersLocked(job)
        }
        DispatchQueue.global().async { sink?.contentRejected(ino) }
        return false
    }

    /// Saves the progress of every download under way and waits for it (at unmount, so the
    /// next run resumes from everything fetched). A save already under way is not enough: it
    /// took its list of chunks when it began (on a busy disk, seconds and many chunks ago), so
    /// each job is saved again, after it on the same serial queue, with the list as it is now.
    public func saveAllProgress() {
        cond.lock()
        for job in jobs.values where !job.done && !job.cancelled { saveProgressLocked(job) }
        cond.unlock()
        saver.sync {}
    }

    /// Records which chunks are in the cache file, after syncing them there, so a restart
    /// resumes instead of starting over (a chunk fetched after the sync is fetched again).
    /// Runs beside the fetches, on a copy of the descriptor: syncing waits for the disk,
    /// fetching need not. Called with `cond` held.
    private func saveProgressLocked(_ job: Job) {
        // Once taken to be closed, its number may be another file's.
        guard !job.fdTaken else { return }
        let fd = dup(job.fd)
        guard fd >= 0 else { return }
        job.saving = true
        let present = job.present, version = job.version, chunkSize = self.chunkSize, state = self.state
        saver.async { [self] in
            if fdatasync(fd) == 0 {
                try? state.write { try $0.saveDownload(job.ino, version: version, chunkSize: chunkSize, present: present) }
            }
            close(fd)
            cond.lock()
            job.saving = false
            job.savedAt = time.now
            cond.unlock()
        }
    }

    /// `job`'s cache file, to be closed by the caller, the first time only (`cond` held). A
    /// download's end and a cancel can meet (the end closes it outside the lock, and a cancel
    /// before the job is dropped found no worker): closed twice, the second close took
    /// whatever the number had become meanwhile in another thread, a store's blob being read
    /// (its copy failed with EBADF) or any other file of the daemon.
    private func closingLocked(_ job: Job) -> Int32? {
        if job.fdTaken { return nil }
        job.fdTaken = true
        return job.fd
    }

    private func finishLocked(_ job: Job) {
        let sink = self.sink, version = job.version
        let fd = closingLocked(job)
        DispatchQueue.global().async { [self] in
            if let fd { cache.closeHeld(job.ino, fd) }
            sink?.contentArrived(job.ino, version: version)
            cond.lock()
            if jobs[job.ino] === job { jobs[job.ino] = nil }
            cond.broadcast()
            cond.unlock()
        }
    }

    /// At most this many fetches of one chunk to find two that agree (`confirmLocked`).
    static let confirmFetches = 12

    /// The SHA-256 of `chunk` as the cache file holds it now (no lock held); nil if unreadable.
    private func chunkDigest(_ job: Job, _ chunk: Int) -> String? {
        let lower = Int64(chunk) * chunkSize
        var d = ContentDigest()
        return d.add(job.fd, lower ..< min(job.size, lower + chunkSize)) ? d.hex() : nil
    }

    /// After a download was thrown away, a chunk just fetched (its digest `sum`) is kept only
    /// when an earlier fetch of it since had the same bytes: a store that now and then sends
    /// other bytes than asked for (a stale cache, a flipped bit) rarely sends the same wrong
    /// ones twice, so the next whole download passes its digest instead of failing again at
    /// the same odds. After `confirmFetches` fetches without two alike, the last is kept and the
    /// whole file's digest decides, as always. Called with `cond` held.
    private func confirmLocked(_ job: Job, _ chunk: Int, _ sum: String) -> Bool {
        var sums = job.fetchedSums[chunk, default: []]
        defer { job.fetchedSums[chunk] = sums }
        if sums.contains(sum) { return true }
        sums.append(sum)
        return sums.count >= Self.confirmFetches || job.cancelled
    }

    /// Fetches one chunk from `version` of `key` and writes it whole (no lock held).
    private func fetchChunk(_ job: Job, _ chunk: Int, key: String, version: String) -> Result<Void, Error> {
        let lower = Int64(chunk) * chunkSize
        let range = lower ..< min(job.size, lower + chunkSize)
        let store = self.store
        var lastError: Error = SyncError.local("no attempt")
        // The space the state database's reserve gave up is not for content.
        if let reserve = cache.reserve, !reserve.contentHasRoom(for: Int64(range.count)) { return .failure(SyncError.noSpace) }
        let retries = SyncRetries.chunk(tries: attempts)
        for attempt in 0 ..< attempts {
            if attempt > 0 { time.sleep(retries.pause(afterFailures: attempt)) }
            do {
                let fd = job.fd
                let got = try runBlocking { try await store.read(key, version: version, range: range, into: fd, at: lower) }
                if got != Int64(range.count) {
                    throw SyncError.sizeMismatch(key: key, expected: Int64(range.count), got: got)
                }
                return .success(())
            } catch let e as LocalWriteError {
                // The disk, not the store: retrying will not help.
                return .failure(e.errno == ENOSPC || e.errno == EDQUOT ? SyncError.noSpace : SyncError.local("\(e)"))
            } catch let e as StoreError where !e.isTransient {
                return .failure(e)  // an answer (gone, changed): retrying will not help
            } catch {
                lastError = error
            }
        }
        return .failure(lastError)
    }
}
