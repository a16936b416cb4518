import Foundation
import Testing
import TestSupport

/// One SeaweedFS for the S3 mount tests of this process (scripts/start-seaweedfs), stopped at exit.
final class S3Server: @unchecked Sendable {
    let dir: String
    /// UBIQ_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION.
    let env: [String: String]
    var endpoint: String { env["UBIQ_S3_ENDPOINT"]! }

    private static let lock = NSLock()
    nonisolated(unsafe) private static var started: Result<S3Server, Error>?

    static func shared() throws -> S3Server {
        lock.lock(); defer { lock.unlock() }
        if let started { return try started.get() }
        let r = Result { try S3Server() }
        started = r
        if case .success = r { atexit { S3Server.stopShared() } }
        return try r.get()
    }

    private static func stopShared() {
        guard case .success(let s) = started else { return }
        shell("'\(packageRoot.path)/scripts/start-seaweedfs' stop '\(s.dir)'; rm -rf '\(s.dir)'")
    }

    private init() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3-mt-\(UUID().uuidString.prefix(8))").path
        let r = shell("'\(packageRoot.path)/scripts/start-seaweedfs' start '\(dir)'", timeout: 120)
        guard r.status == 0 else { throw FixtureError("cannot start SeaweedFS: \(r.err)\(r.out)") }
        var values: [String: String] = [:]
        for line in r.out.split(separator: "\n") where line.hasPrefix("export ") {
            let kv = line.dropFirst(7).split(separator: "=", maxSplits: 1)
            if kv.count == 2 { values[String(kv[0])] = String(kv[1]) }
        }
        guard values["UBIQ_S3_ENDPOINT"] != nil else { throw FixtureError("start-seaweedfs said: \(r.out)") }
        values["AWS_CA_BUNDLE"] = ""
        env = values
    }

    /// A new bucket's name (made by the first mount).
    func bucket(_ label: String) -> String { "\(label)-\(UUID().uuidString.prefix(8).lowercased())" }

    /// A raw S3 request with curl (`path`: /BUCKET/KEY, URL-encoded), as another tool would send.
    @discardableResult
    func curl(_ args: String, _ path: String) -> ShellResult {
        shell("curl -sS -f --aws-sigv4 aws:amz:us-east-1:s3 --user \"$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY\" \(args) '\(endpoint)\(path)'",
              env: env)
    }

    /// A mount of `s3://BUCKET/PREFIX` on this server.
    func mount(_ bucket: String, prefix: String = "drive", name: String = "mnt", extra: String = "",
               daemonEnv: [String: String] = [:]) throws -> MountFixture {
        try MountFixture(store: "s3://\(bucket)/\(prefix)", name: name, extra: "--s3-endpoint \(endpoint) \(extra)",
                         daemonEnv: env.merging(daemonEnv) { _, b in b })
    }
}

/// `ubiq mount` of an S3 bucket (on a real SeaweedFS): shell tools, two devices, big files,
/// objects other tools wrote, keys that are not names, and a server that is down.
@Suite(.serialized) struct S3MountTests {
    /// Two devices on one bucket whose store (as each device sees it) fails 15% of operations,
    /// loses 10% of the answers to writes, cuts 15% of reads short and answers 5% with other
    /// bytes than the version asked for: random POSIX work and a file big enough to go up in
    /// parts reach the other device whole, with no conflict copy, and the writing device keeps
    /// its own folders' modes and xattrs.
    @Test func aFlakyS3StoreLosesNothing() throws {
        let seed = ProcessInfo.processInfo.environment["UBIQ_SEED"].flatMap(Int.init) ?? Int.random(in: 1 ... 1_000_000)
        print("s3 chaos seed \(seed) (replay: UBIQ_SEED=\(seed))")
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("chaos")
        let chaos = "fail=0.15,lose=0.1,short=0.15,wrong=0.05,latency=0-3"
        let a = try s3.mount(bucket, extra: "--upload-delay 0 --poll-interval 1",
                             daemonEnv: ["UBIQ_STORE_CHAOS": "seed=\(seed),\(chaos)", "UBIQ_TRACE_UPLOADS": "1"])
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--poll-interval 1 --read-timeout 60",
                             daemonEnv: ["UBIQ_STORE_CHAOS": "seed=\(seed + 1),\(chaos)"])
        defer { b.cleanup() }
        // SeaweedFS keeps no metadata on folder markers: folders' modes stay on A (docs/s3.md).
        let (fa, fb) = try ReliabilityTests.workThenCompare(a, b, seed: seed, ops: 300, bigMiB: 70, seconds: 180,
                                                            foldersKeepMetadata: false)
        #expect(fa.values.reduce(0, +) > 0 && fb.values.reduce(0, +) > 0, "faults met: \(fa) \(fb)")
        print("s3 chaos seed \(seed): faults injected on A \(fa), on B \(fb)")
    }

    /// The change log through crashes (issue 19): device A is killed at random moments of a
    /// write-heavy workload, over a store that fails and loses answers now and then (a round's
    /// log object then waits for the next round), and mounted again each time; device B
    /// follows it through the log alone (no full listing after its mount). Once A's queue has
    /// drained, B holds every acknowledged file: no write's log entry was lost to a crash.
    @Test func sigkillBetweenWritesAndTheirLogObjectLosesNoEntry() throws {
        let seed = ReliabilityTests.seed()
        print("s3 crash seed \(seed) (replay: UBIQ_SEED=\(seed))")
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("crash")
        let a = try s3.mount(bucket, extra: "--upload-delay 0 --poll-interval 1 --full-listing-interval 86400",
                             daemonEnv: ["UBIQ_STORE_CHAOS": "seed=\(seed),fail=0.1,lose=0.1,latency=0-3"])
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--poll-interval 1 --full-listing-interval 86400")
        defer { b.cleanup() }
        let journal = a.base + "/journal"
        guard let (rounds, operations) = try ReliabilityTests.crashRounds(a, dir: a.mnt + "/c", journal: journal, seed: seed,
                                                                           atLeast: 3, until: Date(timeIntervalSinceNow: 15)) else { return }
        print("s3 crash seed \(seed): \(rounds) SIGKILLs survived, \(operations) acknowledged operations checked")
        let drained = eventually(a, "\(ubiqBinary) sync . >/dev/null; \(ubiqBinary) status -r . | grep -Eq '^ *([0-9]+) items: \\1 current$'", seconds: 120)
        expectOK(drained, "seed \(seed): A's queue drains: \(a.ubiq("status -r \(a.mnt)").out)")
        let seen = eventually(b, "\(ubiqBinary) sync . >/dev/null && python3 \(ReliabilityTests.crashload) verify \(b.mnt)/c \(journal)", seconds: 60)
        expectOK(seen, "seed \(seed): B, by the log alone, has the acknowledged tree")
    }

    /// A device away for longer than the change log is kept (issue 19): its edits wait in its
    /// state, the other device's changes of that time are in no log object any more (deleted
    /// an hour after they were written, by whichever device lists the bucket: here by hand),
    /// and at its next mount it lists the bucket. It gets every change made meanwhile, and its
    /// own edits go up, none lost.
    @Test func aDeviceAwayLongerThanTheLogKeepsItsEditsAndCatchesUp() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("away")
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--upload-delay 3600 --poll-interval 0.5 --full-listing-interval 3600")
        defer { b.cleanup() }
        expectOK(a.sh("mkdir docs && echo one > docs/one && echo two > docs/two && echo three > docs/three && \(ubiqBinary) sync ."))
        expectOK(eventually(b, "test -e docs/three", seconds: 60), "B has A's files")
        // B edits one and makes another, and is gone before they go up (killed: an unmount
        // would send them).
        expectOK(b.sh("echo 'edited on b' > docs/one && echo new > docs/from-b"))
        #expect(b.signalDaemon(SIGKILL))
        shell("fusermount3 -u -z '\(b.mnt)'")
        expectOK(a.sh("echo 'two, edited on a' > docs/two && rm docs/three && echo a > docs/from-a && \(ubiqBinary) sync ."))
        // The log of that time goes, as it would an hour later.
        let logPrefix = "drive/.ubiquity/s3/log/"
        func logKeys() -> [String] {
            let listed = s3.curl("", "/\(bucket)?list-type=2&prefix=\(logPrefix.replacingOccurrences(of: "/", with: "%2F"))").out
            return listed.components(separatedBy: "<Key>").dropFirst().compactMap { $0.components(separatedBy: "</Key>").first }
        }
        _ = waitUntil(seconds: 10, every: 0.2) { !logKeys().isEmpty }
        sleep(1)  // the round's last log object
        let logged = logKeys()
        #expect(!logged.isEmpty)
        for key in logged { expectOK(s3.curl("-X DELETE", "/\(bucket)/\(key)")) }
        #expect(logKeys().isEmpty)
        // B comes back: what A did reaches it by its listing of the bucket, and its own edits
        // are still there, and go up.
        try b.mount()
        expectOK(eventually(b, "grep -qx 'two, edited on a' docs/two && test ! -e docs/three && grep -qx a docs/from-a", seconds: 60),
                 "B has what A did while it was away: \(b.sh("ls -l docs; cat docs/two").out)")
        expectOK(b.sh("grep -qx 'edited on b' docs/one && grep -qx new docs/from-b"), "B keeps its own edits")
        expectOK(b.sh("\(ubiqBinary) sync ."))
        expectOK(eventually(a, "\(ubiqBinary) sync . && grep -qx 'edited on b' docs/one && grep -qx new docs/from-b", seconds: 60),
                 "A has B's edits")
        expectOK(a.sh("test \"$(ls docs | tr '\\n' ' ')\" = 'from-a from-b one two '"), "no conflict copy: \(a.sh("ls docs").out)")
    }

    @Test func shellToolsWorkOnAnS3Mount() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("tools")
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--poll-interval 1")
        defer { b.cleanup() }
        expectOK(a.sh("""
            mkdir -p docs/deep && printf 'hello s3\\n' > docs/note.txt && head -c 3000000 /dev/urandom > docs/deep/blob
            chmod 640 docs/note.txt && ln -s note.txt docs/link && setfattr -n user.color -v blue docs/note.txt
            mkdir empty && mv docs/deep/blob docs/blob.bin && sha256sum docs/blob.bin > /tmp/\(bucket).sum
            \(ubiqBinary) sync docs
            """), "write on A")
        expectOK(eventually(b, "test -f docs/blob.bin && test -L docs/link && test -d empty && test ! -e docs/deep/blob", seconds: 30), "B sees A's tree")
        expectOK(b.sh("""
            set -e
            test "$(stat -c %a docs/note.txt)" = 640
            test "$(readlink docs/link)" = note.txt
            test "$(getfattr --only-values -n user.color docs/note.txt)" = blue
            getfattr --only-values -n user.ubiq.status docs/blob.bin | grep -qx placeholder
            sha256sum -c /tmp/\(bucket).sum
            cat docs/link | grep -qx 'hello s3'
            """), "B's copy")
        // B edits and removes; A sees it.
        // Its index is the owner's only; no secret in the log or on a command line.
        expectOK(a.sh("test \"$(stat -c %a \(a.state)/s3-index.db)\" = 600"), "index mode")
        let secret = s3.env["AWS_SECRET_ACCESS_KEY"]!
        let log = (try? String(contentsOfFile: a.state + "/ubiq.log", encoding: .utf8)) ?? ""
        #expect(!log.isEmpty && !log.contains(secret), "the secret is in the log")
        #expect(!shell("ps -eo args").out.contains(secret), "the secret is on a command line")
        expectOK(b.sh("printf 'edited on B\\n' >> docs/note.txt && rm docs/blob.bin && \(ubiqBinary) sync docs"), "B edits")
        expectOK(a.sh("\(ubiqBinary) sync . && grep -q 'edited on B' docs/note.txt && test ! -e docs/blob.bin"), "A sees B's edit")
        shell("rm -f /tmp/\(bucket).sum")
    }

    /// Edits on two devices at once: both kept (a conflict copy), on both devices.
    @Test func conflictsAreKeptOnS3() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("conflict")
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--upload-delay 0")
        defer { b.cleanup() }
        expectOK(a.sh("echo one > f.txt && \(ubiqBinary) sync ."))
        expectOK(eventually(b, "\(ubiqBinary) sync . && grep -qx one f.txt"))
        // Both edit before either sends: A first, then B finds the store changed.
        expectOK(a.sh("echo from-a > f.txt && \(ubiqBinary) sync ."))
        expectOK(b.sh("echo from-b > f.txt && \(ubiqBinary) sync ."))
        expectOK(eventually(a, "\(ubiqBinary) sync . && ls | grep -q 'f (conflict' && grep -qx from-b f.txt", seconds: 30), "A sees both")
        expectOK(eventually(b, "ls | grep -q 'f (conflict' && grep -qx from-b f.txt && cat f\\ \\(conflict* | grep -qx from-a", seconds: 30), "B keeps both")
    }

    /// A bucket without versioning keeps no prior version: a placeholder whose version was
    /// replaced cannot be read (never the new bytes in place of the old: an error), and the
    /// mount looks at the store at once, so the next open reads the new version.
    @Test func aReplacedVersionIsFetchedAnew() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("replaced")
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--poll-interval 600")
        defer { b.cleanup() }
        expectOK(a.sh("echo one > f.txt && \(ubiqBinary) sync ."))
        expectOK(b.sh("\(ubiqBinary) sync . && getfattr --only-values -n user.ubiq.status f.txt | grep -qx placeholder"))
        expectOK(a.sh("echo two > f.txt && \(ubiqBinary) sync ."))
        let first = b.sh("cat f.txt")
        #expect(first.out != "one\n", "read the replaced version's bytes")
        // No poll is due for ten minutes: only the failed read's look at the store brings it.
        expectOK(eventually(b, "grep -qx two f.txt", seconds: 10), "the new version, soon")
    }

    /// Folders whose markers were deleted in the bucket (by another device or tool, before this
    /// one heard of it), then changed here: one chmod'ed, one moved. A bucket without versions
    /// cannot copy a marker that is gone: they go up anew (an edit beats a delete, as on the
    /// embedded store). They failed for good before, and the delete then took them here too.
    @Test func foldersGoneFromTheBucketAndChangedHereGoUpAgain() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("gone")
        let a = try s3.mount(bucket, extra: "--upload-delay 0 --poll-interval 600", daemonEnv: ["UBIQ_TRACE_UPLOADS": "1"])
        defer { a.cleanup() }
        expectOK(a.sh("mkdir p q && \(ubiqBinary) sync ."), "first upload")
        for key in ["p/", "q/"] { expectOK(s3.curl("-X DELETE", "/\(bucket)/drive/\(key)"), "delete \(key)") }
        expectOK(a.sh("chmod 700 p && mv q r && \(ubiqBinary) sync . && \(ubiqBinary) status -r . | grep -Eq '^ *([0-9]+) items: \\1 current$'"),
                 "both go up again: \(a.ubiq("status -r \(a.mnt)").out) \(shell("tail -30 \(a.state)/ubiq.log").out)")
        for key in ["p/", "r/"] { expectOK(s3.curl("-I", "/\(bucket)/drive/\(key)"), "\(key) is in the bucket") }
    }

    /// A chmod of folders with items in them goes up (found by the S3 chaos test).
    @Test func aChmodOfFoldersWithItemsGoesUp() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("chmod")
        let a = try s3.mount(bucket, extra: "--upload-delay 0", daemonEnv: ["UBIQ_TRACE_UPLOADS": "1"])
        defer { a.cleanup() }
        expectOK(a.sh("mkdir -p x/y && echo hi > x/y/f && \(ubiqBinary) sync ."), "first upload")
        expectOK(a.sh("chmod 700 x/y x && \(ubiqBinary) sync . && \(ubiqBinary) status -r . | grep -Eq '^ *([0-9]+) items: \\1 current$'"),
                 "the chmods go up: \(a.ubiq("status -r \(a.mnt)").out) \(shell("tail -30 \(a.state)/ubiq.log").out)")
    }

    /// A file over the part threshold goes up in parts and comes back whole on another device.
    @Test func bigFilesGoInPartsThroughTheMount() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("big")
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        expectOK(a.sh("head -c 100000000 /dev/urandom > big.bin && sha256sum big.bin > /tmp/\(bucket).sum && \(ubiqBinary) sync . && getfattr --only-values -n user.ubiq.status big.bin"), "upload")
        // Stored in parts: the ETag of a multipart object ends in -PARTS (100 MB: 16 MiB parts, 6).
        let head = s3.curl("-I", "/\(bucket)/drive/big.bin")
        #expect(head.out.lowercased().contains("etag: \"") && head.out.contains("-6\""), "\(head.out)")
        let b = try s3.mount(bucket, name: "device-b")
        defer { b.cleanup() }
        expectOK(b.sh("sha256sum -c /tmp/\(bucket).sum; rc=$?; rm -f /tmp/\(bucket).sum; exit $rc"), "B reads it whole")
    }

    /// Objects another tool put in the bucket show up as files (the user's, 0644), a control
    /// character in a name included; nothing outside the prefix shows. (SeaweedFS itself
    /// refuses keys with `.`/`..` segments, `//`, invalid UTF-8 or 256-byte segments, so the
    /// skipping of those is tested on listing pages: S3StoreTests.keysThatAreNotNamesAreSkipped.)
    @Test func foreignObjectsAndHostileKeys() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("foreign")
        s3.curl("-X PUT", "/\(bucket)")
        let body = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-body-\(UUID().uuidString)").path
        try Data("from elsewhere\n".utf8).write(to: URL(fileURLWithPath: body))
        defer { unlink(body) }
        expectOK(s3.curl("-T \(body)", "/\(bucket)/drive/reports/q3%20final.txt"))
        expectOK(s3.curl("-T \(body)", "/\(bucket)/drive/ctl%01name"))
        expectOK(s3.curl("-T \(body)", "/\(bucket)/outside-the-prefix"))
        let a = try s3.mount(bucket)
        defer { a.cleanup() }
        expectOK(a.sh("""
            set -e
            test "$(cat 'reports/q3 final.txt')" = 'from elsewhere'
            test "$(stat -c '%a %u' 'reports/q3 final.txt')" = "644 $(id -u)"
            test "$(stat -c %a reports)" = 755
            test "$(ls | sort | tr '\\n' ' ')" = "ctl$(printf '\\001')name reports "
            """), "foreign objects")
        expectOK(a.sh("echo mine > reports/new.txt && \(ubiqBinary) sync ."))
        expectOK(s3.curl("-o /dev/null", "/\(bucket)/drive/reports/new.txt"), "written under the prefix")
    }

    /// Another device's changes come from the bucket's change log at each poll; an object
    /// another tool put there is not in the log and waits for the full listing, which
    /// `ubiq sync --full` asks for at once (here the interval is an hour).
    @Test func otherDevicesChangesComeFromTheLogAndOtherToolsFromTheFullListing() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("log")
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--poll-interval 0.5 --full-listing-interval 3600")
        defer { b.cleanup() }
        expectOK(a.sh("mkdir docs && echo one > docs/a.txt && \(ubiqBinary) sync ."))
        expectOK(eventually(b, "grep -qx one docs/a.txt", seconds: 60), "B has A's file by the log")
        expectOK(a.sh("mv docs/a.txt docs/b.txt && echo two >> docs/b.txt && \(ubiqBinary) sync ."))
        expectOK(eventually(b, "test ! -e docs/a.txt && test \"$(tr '\\n' ' ' < docs/b.txt)\" = 'one two '", seconds: 60), "B has A's move and edit")
        let body = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-body-\(UUID().uuidString)").path
        try Data("from elsewhere\n".utf8).write(to: URL(fileURLWithPath: body))
        defer { unlink(body) }
        expectOK(s3.curl("-T \(body)", "/\(bucket)/drive/docs/foreign.txt"))
        // Polls go on (each a look at the log), and none lists the bucket.
        expectOK(a.sh("echo three > docs/c.txt && \(ubiqBinary) sync ."))
        expectOK(eventually(b, "test -e docs/c.txt", seconds: 60), "B has A's newer file")
        #expect(b.sh("test -e docs/foreign.txt").status != 0, "another tool's object came before a full listing")
        expectOK(b.sh("\(ubiqBinary) sync . && test ! -e docs/foreign.txt"), "ubiq sync reads the log only")
        expectOK(b.sh("\(ubiqBinary) sync --full . && grep -qx 'from elsewhere' docs/foreign.txt"), "ubiq sync --full lists the bucket")
    }

    /// A folder moved on one device is moved on the other, through the change log: the same
    /// files and folders (inode numbers: A's whole move reaches the log at once, as one `move`
    /// entry, so B sees it in one look), still downloaded, still pinned, the same bytes; the old
    /// folder gone on both devices (SeaweedFS keeps its directory, and says it is there: docs/s3.md).
    @Test func aFolderMovedOnOneDeviceIsMovedOnTheOther() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("move")
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--poll-interval 0.5 --full-listing-interval 3600")
        defer { b.cleanup() }
        expectOK(a.sh("mkdir -p photos/2024 && for i in $(seq 1 40); do head -c $((4000 + i)) /dev/urandom > photos/p$i.jpg; done"
                      + " && for i in $(seq 1 10); do head -c 9000 /dev/urandom > photos/2024/q$i.jpg; done && \(ubiqBinary) sync ."))
        expectOK(eventually(b, "test $(ls photos | wc -l) = 41 && test $(ls photos/2024 | wc -l) = 10", seconds: 60), "B has A's folder")
        expectOK(b.sh("setfattr -n user.ubiq.pinned -v 1 photos && cat photos/*.jpg photos/2024/* | md5sum > /tmp/\(bucket).sum"))
        expectOK(eventually(b, "! getfattr --only-values -n user.ubiq.status photos/*.jpg photos/2024/* | grep -v current", seconds: 30))
        let before = b.sh("stat -c %i photos photos/2024 photos/p7.jpg photos/2024/q3.jpg photos/p40.jpg").out
        expectOK(a.sh("mv photos pictures && \(ubiqBinary) sync ."))
        expectOK(eventually(b, "test ! -e photos && test $(ls pictures | wc -l) = 41 && test $(ls pictures/2024 | wc -l) = 10", seconds: 60),
                 "B has A's move: \(b.sh("ls -R").out) \(shell("grep -v 'moved here' \(b.state)/ubiq.log | tail -40; echo ====A; tail -40 \(a.state)/ubiq.log").out)")
        #expect(b.sh("stat -c %i pictures pictures/2024 pictures/p7.jpg pictures/2024/q3.jpg pictures/p40.jpg").out == before, "the same items")
        // In the log: one move entry, no delete of an old key.
        let logKeys = s3.curl("", "/\(bucket)?list-type=2").out
            .components(separatedBy: "<Key>").dropFirst().compactMap { $0.components(separatedBy: "</Key>").first }
            .filter { $0.hasPrefix("drive/.ubiquity/s3/log/") }
        let log = logKeys.map { s3.curl("", "/\(bucket)/\($0)").out }.joined(separator: "\n").split(separator: "\n")
        #expect(log.filter { $0.contains(#""from":"photos/""#) && $0.contains(#""op":"move","to":"pictures/""#) }.count == 1
                    && !log.contains { $0.contains(#""key":"photos/"#) && $0.contains(#""op":"delete""#) }, "\(log.joined(separator: "\n"))")
        expectOK(b.sh("! getfattr --only-values -n user.ubiq.status pictures/*.jpg pictures/2024/* | grep -v current"), "all still downloaded")
        expectOK(b.sh("getfattr --only-values -n user.ubiq.pinned pictures | grep -qx 1"), "still pinned")
        expectOK(b.sh("cat pictures/*.jpg pictures/2024/* | md5sum | cmp - /tmp/\(bucket).sum && rm /tmp/\(bucket).sum"))
        expectOK(b.sh("grep -c 'moved here' \(b.state)/ubiq.log"), "B's log says so")
        // Nothing of it goes up from B, and the bucket has the folder once, under its new name.
        expectOK(eventually(a, "\(ubiqBinary) sync . && test ! -e photos", seconds: 10))
        let listed = s3.curl("", "/\(bucket)?list-type=2")
        #expect(listed.status == 0 && listed.out.contains("drive/pictures/p7.jpg") && !listed.out.contains("drive/photos"), "\(listed.out)")
    }

    /// A file not downloaded on B, whose folder A renamed: its old key is gone from the bucket
    /// before B has read the log that tells of the move (B looks once an hour unless asked).
    /// Read at its old name, the read asks B to look, waits for the move and reads the file at
    /// its new key; before, it failed (EIO) until B's next look.
    @Test func aFileReadAsItsFolderMovesElsewhereIsReadAtItsNewKey() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("readmove")
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--poll-interval 3600 --full-listing-interval 3600")
        defer { b.cleanup() }
        expectOK(a.sh("mkdir docs && echo hello > docs/a.txt && head -c 3000000 /dev/urandom > docs/big && \(ubiqBinary) sync ."))
        expectOK(b.sh("\(ubiqBinary) sync . && test -e docs/a.txt && test -e docs/big"))
        let sum = a.sh("md5sum < docs/big").out
        expectOK(a.sh("mv docs moved && \(ubiqBinary) sync ."))
        let small = b.sh("cat docs/a.txt")
        #expect(small.status == 0 && small.out == "hello\n", "\(small.err) \(shell("tail -5 \(b.state)/ubiq.log").out)")
        expectOK(b.sh("test -e moved/a.txt && test ! -e docs"), "B has the move")
        expectOK(b.sh("[ \"$(md5sum < moved/big)\" = '\(sum.trimmingCharacters(in: .whitespacesAndNewlines))' ]"), "and the other file, whole")
    }

    /// Folders another tool made (no markers; SeaweedFS still answers a HEAD of `docs/` for its
    /// directory): renamed on A, the old one goes from B; emptied by `rm` on A, it stays on A
    /// and on B, and its marker is in the bucket.
    @Test func foldersAnotherToolMadeGoOnlyWhereTheyWent() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("nomarker")
        s3.curl("-X PUT", "/\(bucket)")
        let body = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-body-\(UUID().uuidString)").path
        try Data("from elsewhere\n".utf8).write(to: URL(fileURLWithPath: body))
        defer { unlink(body) }
        for key in ["docs/a", "docs/b", "tmp/c", "tmp/d"] { expectOK(s3.curl("-T \(body)", "/\(bucket)/drive/\(key)")) }
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try s3.mount(bucket, name: "device-b", extra: "--poll-interval 0.5 --full-listing-interval 3600")
        defer { b.cleanup() }
        expectOK(b.sh("test -e docs/a && test -e tmp/d"))
        expectOK(a.sh("rm docs/a docs/b && mv tmp moved && \(ubiqBinary) sync ."))
        expectOK(eventually(b, "test ! -e tmp && test -e moved/c && test -e moved/d", seconds: 60),
                 "B: \(b.sh("ls -R").out) \(shell("tail -20 \(b.state)/ubiq.log").out)")
        expectOK(eventually(b, "test ! -e docs/a && test ! -e docs/b", seconds: 60))
        expectOK(b.sh("test -d docs && test -z \"$(ls docs)\""), "B keeps the folder A keeps")
        expectOK(a.sh("test -d docs && test -z \"$(ls docs)\""))
        let listed = s3.curl("", "/\(bucket)?list-type=2")
        #expect(listed.out.contains("<Key>drive/docs/</Key>") && !listed.out.contains("drive/tmp/"), "\(listed.out)")
    }

    /// A server that is down: a device that never reached it cannot mount (a clear error); one
    /// that did mounts with what it knew, and reads what it has.
    @Test func aStoreThatIsDown() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("down")
        let a = try s3.mount(bucket, extra: "--upload-delay 0")
        defer { a.cleanup() }
        expectOK(a.sh("echo kept > here.txt && cat here.txt > /dev/null && \(ubiqBinary) sync . && \(ubiqBinary) unmount ."))
        // Nothing listens on this port.
        let dead = "http://127.0.0.1:9"
        let fresh = try? MountFixture(store: "s3://\(bucket)/drive", name: "never", extra: "--s3-endpoint \(dead)", daemonEnv: s3.env)
        #expect(fresh == nil, "a device that never reached the store mounted")
        let never = "/tmp/ubiq-never-\(bucket)"
        let r = shell("mkdir -p \(never)/m && \(ubiqBinary) mount --store s3://\(bucket)/drive --s3-endpoint \(dead) --state \(never)/state \(never)/m; rc=$?; [ -e \(never)/state ] && echo \"state left behind: $(ls -A \(never)/state)\" >&2; rm -rf \(never); exit $rc",
                      env: s3.env.merging(a.env) { x, _ in x })
        #expect(r.status != 0 && r.err.contains("unavailable"), "\(r.err)")
        // In the system's words, with parentheses that close (NIO's own text did not).
        #expect(r.err.contains("Connection refused (errno 111)"), "\(r.err)")
        #expect(r.err.filter { $0 == "(" }.count == r.err.filter { $0 == ")" }.count, "\(r.err)")
        #expect(!r.err.contains("state left behind"), "a failed first mount left its state (s3-index.db, state.db): \(r.err)")
        let back = shell("\(ubiqBinary) mount --store s3://\(bucket)/drive --s3-endpoint \(dead) --state \(a.state) \(a.mnt)",
                         env: s3.env.merging(a.env) { x, _ in x })
        expectOK(back, "remount while the store is down")
        expectOK(a.sh("grep -qx kept here.txt && echo new > offline.txt"), "work offline")
        // A sync says the store cannot be reached, rather than wait out a minute for the upload
        // of offline.txt (it said nothing until its caller gave up).
        let sync = a.sh("timeout 45 \(ubiqBinary) sync .")
        #expect(sync.status == 1 && (sync.out + sync.err).contains("could not be reached"), "\(sync.status): \(sync.out)\(sync.err)")
        let log = (try? String(contentsOfFile: a.state + "/ubiq.log", encoding: .utf8)) ?? ""
        #expect(log.contains("working with what this device knew"))
    }

    /// A device's state serves the store it was made with: an S3 device's state on a directory
    /// store or another bucket, and a directory store's state on S3, are refused with one clear
    /// line, and nothing of theirs goes there (an S3 state on a dir: store mounted, and
    /// uploaded its pending files into it). Its own store still mounts.
    @Test func aStateServesOnlyItsOwnStore() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("bound")
        let a = try s3.mount(bucket, extra: "--upload-delay 600")
        defer { a.cleanup() }
        expectOK(a.sh("echo pending > p.txt"))
        expectOK(a.ubiq("unmount --timeout 0 \(a.mnt)"))
        let other = a.base + "/other"
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        let env = s3.env.merging(a.env) { x, _ in x }
        let onDir = shell("\(ubiqBinary) mount --store dir:\(other) --state \(a.state) \(a.mnt)", env: env)
        #expect(onDir.status != 0 && onDir.err.contains("belongs to s3://\(bucket)/drive/"), "\(onDir.out)\(onDir.err)")
        #expect(shell("ls -A \(other)").out.isEmpty, "the refused mount touched the other store")
        let onBucket = shell("\(ubiqBinary) mount --store s3://\(bucket)-x/drive --s3-endpoint \(s3.endpoint) --state \(a.state) \(a.mnt)", env: env)
        #expect(onBucket.status != 0 && onBucket.err.contains("belongs to s3://\(bucket)/drive/"), "\(onBucket.err)")
        try a.mount()
        expectOK(a.sh("[ \"$(cat p.txt)\" = pending ]"))
        // And a directory store's state on S3.
        let d = try MountFixture()
        defer { d.cleanup() }
        expectOK(d.unmount())
        let onS3 = shell("\(ubiqBinary) mount --store s3://\(bucket)/drive --s3-endpoint \(s3.endpoint) --state \(d.state) \(d.mnt)", env: env)
        #expect(onS3.status != 0 && onS3.err.contains("belongs to dir:"), "\(onS3.err)")
    }

    /// `ubiq kv` works on an S3 store too, beside a mount of it that does not show its objects.
    @Test func keyValueStoreOnS3() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("kv")
        let a = try s3.mount(bucket)
        defer { a.cleanup() }
        let store = "--store s3://\(bucket)/drive --s3-endpoint \(s3.endpoint)"
        expectOK(a.ubiq("kv set \(store) --type json prefs '{\"theme\": \"dark\"}'"))
        #expect(a.ubiq("kv get \(store) prefs").out == "{\"theme\":\"dark\"}\n")
        #expect(a.ubiq("kv list \(store)").out == "prefs\t{\"theme\":\"dark\"}\n")
        expectOK(a.sh("\(ubiqBinary) sync . && test -z \"$(ls -A)\""), "kv objects showed as files")
    }

    /// A container the bucket does not have: the mount says the whole command that makes it,
    /// endpoint and region too, and that command, run as said, makes it there.
    @Test func theMissingContainerHintIsACommandThatWorks() throws {
        let s3 = try S3Server.shared()
        let bucket = s3.bucket("hint")
        let a = try s3.mount(bucket)
        defer { a.cleanup() }
        let free = a.base + "/free"
        try FileManager.default.createDirectory(atPath: free, withIntermediateDirectories: true)
        let env = s3.env.merging(a.env) { x, _ in x }
        let mount = "\(ubiqBinary) mount --store s3://\(bucket)/drive --s3-endpoint \(s3.endpoint) --container com.example.none --state \(a.base)/st \(free)"
        let missing = shell(mount, env: env)
        let said = missing.err.components(separatedBy: "make it with ").last?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
        #expect(missing.status != 0 && said.hasPrefix("ubiq container create com.example.none --store s3://\(bucket)/drive")
                && said.contains("--s3-endpoint \(s3.endpoint)"), "\(missing.err)")
        expectOK(shell("PATH=\((ubiqBinary as NSString).deletingLastPathComponent):$PATH \(said)", env: env), "the hint's command")
        expectOK(shell(mount, env: env), "the container made by the hint")
        expectOK(shell("\(ubiqBinary) unmount \(free)", env: env))
    }

    @Test func badS3ArgumentsAreClearErrors() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3args-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: dir + "/m", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let cases: [(String, [String: String], String)] = [
            ("--store s3://UPPER/x", ["AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"], "not a bucket name"),
            ("--store s3://good-bucket/a/../b", ["AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"], "prefix"),
            ("--store s3://good-bucket --s3-endpoint ftp://x", ["AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"], "endpoint"),
            ("--store s3://good-bucket --s3-endpoint http://127.0.0.1:9", ["AWS_ACCESS_KEY_ID": "", "AWS_SHARED_CREDENTIALS_FILE": dir + "/none"], "credentials"),
            ("--store s3://good-bucket --quota 1G --s3-endpoint http://127.0.0.1:9", ["AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"], "quota"),
            ("--store gs://bucket", [:], "unsupported store URL"),
        ]
        for (args, env, says) in cases {
            let r = shell("\(ubiqBinary) mount \(args) --state \(dir)/state \(dir)/m",
                          env: env.merging(["XDG_STATE_HOME": dir + "/xdg", "AWS_CA_BUNDLE": ""]) { a, _ in a })
            #expect(r.status != 0 && r.err.contains(says), "\(args): \(r.err)")
            #expect(!FileManager.default.fileExists(atPath: dir + "/state"), "\(args) made the state directory")
        }
    }
}
