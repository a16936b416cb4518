import Foundation
import Testing

/// Many devices on one store, through real mounts and shell tools: conflicts kept and
/// settled with `ubiq versions` / `ubiq resolve`, history with `ubiq restore`, offline work
/// that survives a killed daemon.
@Suite(.serialized) struct SyncTests {
    /// Two devices, B offline while both edit one file: both versions are kept on both, and
    /// resolving on A settles it on B.
    @Test func conflictsAreKeptAndResolvedEverywhere() throws {
        let a = try MountFixture(extra: "--upload-delay 0 --poll-interval 1")
        defer { a.cleanup() }
        let offline = a.base + "/b-offline"
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--upload-delay 0 --poll-interval 1",
                                 daemonEnv: ["UBIQ_STORE_OFFLINE_FLAG": offline])
        defer { b.cleanup() }
        expectOK(a.sh("printf 'base\\n' > plan.txt"))
        expectOK(eventually(b, "[ \"$(cat plan.txt)\" = base ]"), "the file reaches B")
        // B loses the store; its edit stays here, queued, and says why.
        _ = FileManager.default.createFile(atPath: offline, contents: nil)
        expectOK(b.sh("printf 'from B\\n' > plan.txt && [ \"$(cat plan.txt)\" = 'from B' ]"), "B writes offline")
        expectOK(eventually(b, "[ \"$(getfattr --only-values -n user.ubiq.status plan.txt)\" = uploading ] && getfattr --only-values -n user.ubiq.uploading-error plan.txt | grep -q unavailable"),
                 "B shows the edit waiting: \(b.statusOf("plan.txt"))")
        // Its root says the store cannot be reached, and when it last was.
        expectOK(eventually(b, "getfattr --only-values -n user.ubiq.store-error . | grep -q unavailable && getfattr --only-values -n user.ubiq.store-reached . | grep -q T"),
                 "B's root says why: \(b.sh("getfattr -d -m user.ubiq.store . 2>&1; getfattr -n user.ubiq.store-error . 2>&1").out)")
        #expect(b.ubiq("status \(b.mnt)").out.contains("the last look failed: "))
        expectOK(a.sh("printf 'from A\\n' > plan.txt"))
        expectOK(eventually(a, "[ \"$(getfattr --only-values -n user.ubiq.status plan.txt)\" = current ]"))
        // B is back: its upload meets A's version, and both are kept.
        try FileManager.default.removeItem(atPath: offline)
        expectOK(eventually(b, "[ -z \"$(getfattr --only-values -n user.ubiq.store-error .)\" ]"), "B reaches the store again")
        let settled = "ls | grep -q '^plan (conflict .*)\\.txt$' && [ \"$(cat plan.txt)\" = 'from B' ] && [ \"$(cat plan\\ \\(conflict*)\" = 'from A' ] && [ \"$(getfattr --only-values -n user.ubiq.status plan.txt)\" = conflict ]"
        expectOK(eventually(b, settled), "B keeps both: \(b.sh("ls -la").out + b.statusOf("plan.txt"))")
        expectOK(eventually(a, settled), "A keeps both: \(a.sh("ls -la").out)")
        // `ubiq versions` lists the copy; the bytes are byte for byte what A wrote.
        let v = a.ubiq("versions --json \(a.mnt)/plan.txt")
        expectOK(v)
        let listed = try JSONSerialization.jsonObject(with: Data(v.out.utf8)) as? [String: Any]
        let conflicts = listed?["conflicts"] as? [[String: Any]] ?? []
        #expect(conflicts.count == 1 && listed?["status"] as? String == "conflict", "\(v.out)")
        #expect((conflicts.first?["name"] as? String)?.hasPrefix("plan (conflict ") == true)
        #expect(a.ubiq("versions \(a.mnt)/plan.txt").out.contains("conflict copies"))
        // Bad input: one clear line, nothing changed.
        let bad = a.ubiq("resolve \(a.mnt)/plan.txt --keep nonsense")
        #expect(bad.status != 0 && bad.err.contains("not a conflict copy"), "\(bad.err)")
        #expect(a.ubiq("resolve \(a.mnt)/plan.txt").status != 0)
        #expect(a.ubiq("resolve \(a.mnt)/plan.txt --keep current --with /etc/hostname").status != 0)
        expectOK(a.sh("ls | grep -q conflict"))
        // Keep A's version (the copy) on A: B follows.
        let copyName = conflicts.first?["name"] as? String ?? ""
        expectOK(a.ubiq("resolve \(a.mnt)/plan.txt --keep '\(copyName)'"))
        let resolved = "[ \"$(ls)\" = plan.txt ] && [ \"$(cat plan.txt)\" = 'from A' ] && [ \"$(getfattr --only-values -n user.ubiq.status plan.txt)\" != conflict ]"
        expectOK(eventually(a, resolved), "resolved on A: \(a.sh("ls -la").out)")
        expectOK(eventually(b, resolved), "resolved on B: \(b.sh("ls -la").out)")
    }

    /// `ubiq sync` does not wait: on A it sends a save at once (not after the delay that
    /// gathers saves), on B it brings it in at once (not at the next poll).
    @Test func ubiqSyncSendsAndBringsChangesAtOnce() throws {
        let a = try MountFixture(extra: "--upload-delay 60 --poll-interval 600")
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--poll-interval 600")
        defer { b.cleanup() }
        expectOK(a.sh("echo now > urgent.txt"))
        expectOK(a.sh("[ \"$(getfattr --only-values -n user.ubiq.status urgent.txt)\" = uploading ]"), "held for the delay")
        expectOK(a.ubiq("sync \(a.mnt)"))
        expectOK(eventually(a, "[ \"$(getfattr --only-values -n user.ubiq.status urgent.txt)\" = current ]", seconds: 10),
                 "sent at once: \(a.statusOf("urgent.txt"))")
        #expect(b.sh("cat urgent.txt").status != 0, "B has not looked yet")
        expectOK(b.ubiq("sync \(b.mnt)"))
        expectOK(b.sh("[ \"$(cat urgent.txt)\" = now ]"), "B has it as soon as ubiq sync returns")
    }

    /// `ubiq sync` waits for a queue that takes longer than one action's wait, to its end, as
    /// long as it moves (a folder of 10,000 files moved: 10,000 copies). Here each action
    /// waits 1.5 s (`UBIQ_SYNC_WAIT`) and the queue takes about 4 s.
    @Test func ubiqSyncWaitsForALongQueueWhileItMoves() throws {
        let a = try MountFixture(extra: "--upload-delay 60 --poll-interval 600",
                                 daemonEnv: ["UBIQ_STORE_WRITE_RATE": "1M", "UBIQ_SYNC_WAIT": "1.5"])
        defer { a.cleanup() }
        expectOK(a.sh("mkdir q && for i in 1 2 3 4 5 6 7 8 9 10; do head -c 400K /dev/urandom > q/f$i; done"))
        let sync = a.ubiq("sync \(a.mnt)")
        #expect(sync.status == 0 && sync.out.hasPrefix("synced"), "\(sync.out)\(sync.err)")
        expectOK(a.sh("for i in 1 2 3 4 5 6 7 8 9 10; do [ \"$(getfattr --only-values -n user.ubiq.status q/f$i)\" = current ] || exit 1; done"),
                 "all of them went up before ubiq sync returned: \(a.sh("getfattr -R --absolute-names -n user.ubiq.status q").out)")
    }

    /// `ubiq versions --all` lists what the store keeps; `ubiq restore` brings one back on
    /// every device; `resolve --with` writes a merge.
    @Test func historyAndRestore() throws {
        let a = try MountFixture(extra: "--upload-delay 0 --poll-interval 1")
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--poll-interval 1 --upload-delay 60")
        defer { b.cleanup() }
        for text in ["one", "two", "three"] {
            expectOK(a.sh("printf \(text) > notes.md"))
            expectOK(eventually(a, "[ \"$(getfattr --only-values -n user.ubiq.status notes.md)\" = current ]"))
        }
        let h = a.ubiq("versions --all --json \(a.mnt)/notes.md")
        expectOK(h)
        let history = ((try JSONSerialization.jsonObject(with: Data(h.out.utf8)) as? [String: Any])?["history"] as? [[String: Any]]) ?? []
        #expect(history.count == 3, "\(h.out)")
        #expect(history.first?["current"] as? Bool == true)
        let first = history.last?["version"] as? String ?? ""
        expectOK(a.ubiq("restore \(a.mnt)/notes.md \(first)"))
        expectOK(a.sh("[ \"$(cat notes.md)\" = one ]"), "restored at once on A")
        expectOK(eventually(b, "[ \"$(cat notes.md)\" = one ]"), "and on B")
        let unknown = a.ubiq("restore \(a.mnt)/notes.md no-such-version")
        #expect(unknown.status != 0 && unknown.err.contains("no version"), "\(unknown.err)")
        // A file not uploaded yet (B waits 60 s before uploading) has no history: one clear line.
        expectOK(b.sh("echo draft > draft.md"))
        let fresh = b.ubiq("versions --all \(b.mnt)/draft.md")
        #expect(fresh.status == 1 && fresh.err.contains("not in the store yet") && !fresh.err.contains("I/O"), "\(fresh.err)")
        // A merge written with --with becomes the file everywhere.
        let merged = a.base + "/merged.md"
        try "merged\n".write(toFile: merged, atomically: true, encoding: .utf8)
        expectOK(a.ubiq("resolve \(a.mnt)/notes.md --with \(merged)"))
        expectOK(eventually(b, "[ \"$(cat notes.md)\" = merged ]"))
    }

    /// `ubiq pause`: nothing goes up and nothing comes in, across a restart, until `ubiq resume`;
    /// the mount says so (`ubiq status`, `user.ubiq.sync-paused`) and `ubiq sync` says why it
    /// does nothing.
    @Test func pauseAndResumeFromTheShell() throws {
        let a = try MountFixture(extra: "--upload-delay 0 --poll-interval 1")
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--upload-delay 0 --poll-interval 1")
        defer { b.cleanup() }
        #expect(b.ubiq("pause --for 0 \(b.mnt)").err.contains("cannot read --for 0 as a length of time"))
        let paused = b.ubiq("pause \(b.mnt)")
        expectOK(paused)
        #expect(paused.out.contains("paused until ubiq resume"), "\(paused.out)")
        expectOK(b.sh("[ \"$(getfattr --only-values -n user.ubiq.sync-paused .)\" = indefinitely ] && echo b > from-b.txt"))
        expectOK(a.sh("echo a > from-a.txt"))
        expectOK(eventually(a, "[ \"$(getfattr --only-values -n user.ubiq.status from-a.txt)\" = current ]"))
        let status = b.ubiq("status \(b.mnt)")
        #expect(status.out.contains("sync paused until ubiq resume"), "\(status.out)")
        let sync = b.ubiq("sync \(b.mnt)")
        #expect(sync.status != 0 && sync.err.contains("sync is paused until ubiq resume"), "\(sync.err)")
        // Mounted again: still paused.
        expectOK(b.ubiq("unmount --timeout 30 \(b.mnt)"))
        try b.mount()
        expectOK(b.sh("[ \"$(getfattr --only-values -n user.ubiq.sync-paused .)\" = indefinitely ] && [ ! -e from-a.txt ]"),
                 "\(b.sh("ls").out)")
        expectOK(b.sh("[ \"$(getfattr --only-values -n user.ubiq.status from-b.txt)\" = uploading ]"))
        #expect(a.sh("[ -e from-b.txt ]").status != 0, "uploaded while paused")
        let resumed = b.ubiq("resume \(b.mnt)")
        expectOK(resumed)
        #expect(resumed.out.contains("resumed"), "\(resumed.out)")
        expectOK(eventually(b, "[ \"$(cat from-a.txt)\" = a ] && [ \"$(getfattr --only-values -n user.ubiq.status from-b.txt)\" = current ]"))
        expectOK(eventually(a, "[ \"$(cat from-b.txt)\" = b ]"))
    }

    /// Offline: local work goes on, placeholders fail with EIO after the bounded wait, the
    /// queue survives a killed daemon, and drains when the store is back.
    @Test func offlineWorkSurvivesAKilledDaemon() throws {
        let a = try MountFixture(extra: "--upload-delay 0 --poll-interval 1")
        defer { a.cleanup() }
        let offline = a.base + "/b-offline"
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--upload-delay 0 --poll-interval 1 --read-timeout 2",
                                 daemonEnv: ["UBIQ_STORE_OFFLINE_FLAG": offline])
        defer { b.cleanup() }
        expectOK(a.sh("head -c 100000 /dev/urandom > remote.bin && mkdir -p shared"))
        expectOK(eventually(b, "[ -f remote.bin ] && [ -d shared ]"))
        _ = FileManager.default.createFile(atPath: offline, contents: nil)
        // A placeholder cannot be read: EIO after the wait, not a hang.
        let read = b.sh("cat remote.bin > /dev/null")
        #expect(read.status != 0 && read.err.contains("Input/output error"), "\(read.err)")
        // Everything local works.
        expectOK(b.sh("mkdir -p work && for i in 1 2 3 4 5; do echo \"line $i\" > work/f$i; done && mv work/f5 shared/moved && rm work/f4 && [ $(ls work | wc -l) = 3 ]"))
        expectOK(b.sh("[ \"$(getfattr --only-values -n user.ubiq.status work/f1)\" = uploading ]"))
        // Killed while offline, mounted again while still offline: the queue is all there.
        #expect(b.signalDaemon(SIGKILL))
        shell("fusermount3 -u -z '\(b.mnt)'")
        try b.mount()
        expectOK(b.sh("[ \"$(cat work/f1)\" = 'line 1' ] && [ \"$(cat shared/moved)\" = 'line 5' ] && [ ! -e work/f4 ]"), "after the restart")
        expectOK(b.sh("[ \"$(getfattr --only-values -n user.ubiq.status work/f2)\" = uploading ]"))
        // `ubiq sync` says so in one line (it asks through the control socket), not as an I/O
        // error of the mount.
        let sync = b.ubiq("sync \(b.mnt)")
        #expect(sync.status != 0 && sync.err.contains("cannot sync \(b.mnt): the store could not be reached")
                    && !sync.err.contains("I/O error"), "\(sync.err)")
        // With what the user wants to know: since when, and how much waits.
        #expect(sync.err.contains("the store was not reached since the mount; ") && sync.err.contains(" changes wait to upload")
                    && !sync.err.contains("? changes"), "\(sync.err)")
        // Unmounted while offline: the store is asked once, not waited for over the unmount's
        // timeout (it waited it all out, then tried the change log again); the queue stays.
        let u = b.ubiq("unmount --timeout 120 \(b.mnt)")
        expectOK(u)
        #expect(u.out.contains("changes not yet uploaded"), "\(u.out)")
        let log = (try? String(contentsOfFile: b.state + "/ubiq.log", encoding: .utf8)) ?? ""
        #expect(log.contains("the store does not answer: ") && !log.contains("pending changes (up to 120 s)"), "\(log.suffix(800))")
        try b.mount()
        // Back online: it all goes up, and reaches A.
        try FileManager.default.removeItem(atPath: offline)
        expectOK(eventually(a, "[ \"$(cat work/f1)\" = 'line 1' ] && [ \"$(cat work/f3)\" = 'line 3' ] && [ \"$(cat shared/moved)\" = 'line 5' ] && [ ! -e work/f4 ] && [ ! -e work/f5 ]", seconds: 40),
                 "A gets B's offline work: \(a.sh("ls -laR").out)")
        expectOK(b.sh("cmp remote.bin \(a.mnt)/remote.bin"), "the placeholder reads once the store is back")
    }

    /// A mount again waits for its listing of the store (1,000 LISTs for a million objects on
    /// S3) 2 s at most: the listing is the feed's first poll, which goes on after the mount
    /// answers, and which `ubiq sync` waits for. Here the listing is held until the test lets
    /// it go (before, `ubiq mount` waited for it): the mount answers, reads what it had,
    /// writes; another device's file, there before the mount, arrives once the listing goes,
    /// and the new file reaches it.
    @Test func aMountAgainDoesNotWaitForTheStoresListing() throws {
        let a = try MountFixture(extra: "--upload-delay 0 --poll-interval 1",
                                 daemonEnv: ["UBIQ_STORE_LIST_GATE": FileManager.default.temporaryDirectory.path + "/list-gate-\(UUID())"])
        defer { a.cleanup() }
        let gate = try #require(a.env["UBIQ_STORE_LIST_GATE"])
        defer { unlink(gate) }
        expectOK(a.sh("mkdir d && echo mine > d/mine && \(ubiqBinary) sync ."))
        expectOK(a.unmount())
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--upload-delay 0 --poll-interval 1")
        defer { b.cleanup() }
        expectOK(b.sh("echo theirs > d/theirs && \(ubiqBinary) sync ."))
        #expect(FileManager.default.createFile(atPath: gate, contents: nil))
        // An unmount while the listing is held ends it (before: the unmount waited for it,
        // 14 s at a million objects on S3); the next mount lists again.
        try a.mount()
        expectOK(a.unmount(), "an unmount during the first poll's listing")
        try a.mount()
        expectOK(a.sh("[ \"$(cat d/mine)\" = mine ] && echo new > d/new && ls d"), "the mount answers while the store is listed")
        #expect(!FileManager.default.fileExists(atPath: a.mnt + "/d/theirs"), "the listing is held, and the feed's first poll with it")
        // The root says so, and `ubiq status` with it.
        expectOK(a.sh("[ \"$(getfattr --only-values -n user.ubiq.store-listing .)\" = 1 ] && [ -z \"$(getfattr --only-values -n user.ubiq.store-reached .)\" ]"),
                 "the listing under way, the store not reached yet")
        let during = a.ubiq("status \(a.mnt)")
        #expect(during.out.contains("store of \(a.mnt): listing it") && during.out.contains("not reached since the mount"), "\(during.out)")
        // `ubiq sync` waits for that listing, and meanwhile the mount's root takes new names: it
        // asks through the control socket, where a `setfattr` of the root had the kernel hold
        // the root's lock until it was answered (every new name there waited for the listing).
        let syncOut = a.state + "-sync.out"
        let syncing = try a.start("\(ubiqBinary) sync . > \(syncOut) 2>&1")
        defer { if syncing.isRunning { syncing.terminate(); syncing.waitUntilExit() } }
        usleep(500_000)  // (the sync asked; were it not yet, this would pass without testing it)
        // A name waiting for the root's lock cannot be stopped (`timeout` does not end it): the
        // listing is let go after 30 s whatever happens, and the names must come before that.
        let letGo = DispatchWorkItem { unlink(gate) }
        DispatchQueue.global().asyncAfter(deadline: .now() + 30, execute: letGo)
        expectOK(a.sh("touch made-while-syncing && ls made-while-syncing not-there 2>/dev/null; [ $? = 2 ] && mkdir made-dir", timeout: 120),
                 "new names in the root while `ubiq sync` waits")
        #expect(FileManager.default.fileExists(atPath: gate) && syncing.isRunning,
                "the root answered new names while the sync waited for the held listing, not once it was let go")
        letGo.cancel()
        unlink(gate)
        syncing.waitUntilExit()
        #expect(syncing.terminationStatus == 0 && readWhole(syncOut).contains("synced"), "\(readWhole(syncOut))")
        expectOK(a.ubiq("sync \(a.mnt)"))
        expectOK(a.sh("[ \"$(getfattr --only-values -n user.ubiq.store-listing .)\" = 0 ] && getfattr --only-values -n user.ubiq.store-reached . | grep -Eq '^20[0-9]{2}-[0-9]{2}-[0-9]{2}T' && [ -z \"$(getfattr --only-values -n user.ubiq.store-error .)\" ]"),
                 "the listing over, the store reached")
        let after = a.ubiq("status --json \(a.mnt)")
        let doc = try JSONSerialization.jsonObject(with: Data(after.out.utf8)) as? [String: Any]
        let store = (doc?["stores"] as? [[String: Any]])?.first
        #expect(store?["listing"] as? Bool == false && store?["reached"] is String && store?["error"] is NSNull, "\(after.out)")
        expectOK(a.sh("[ \"$(cat d/theirs)\" = theirs ] && [ \"$(ls d | tr '\\n' ' ')\" = 'mine new theirs ' ]"), "after the listing: \(a.sh("ls -la d").out)")
        expectOK(eventually(b, "[ \"$(cat d/new)\" = new ] && [ -f made-while-syncing ] && [ -d made-dir ]"), "the new files reach the other device")
        let log = (try? String(contentsOfFile: a.state + "/ubiq.log", encoding: .utf8)) ?? ""
        #expect(log.contains("listings of the whole store wait while"), "the gate was in place")
        #expect(log.contains("the first look at the store takes more than 2 s"), "the mount waited for it, and no longer")
        #expect(!log.contains("could not follow the store's changes"), "the unmount's end of the listing is no failure")
    }

    /// SIGKILL while a file goes up (a new file, then an edit of it), then mount again: the
    /// upload starts over, nothing is lost, no false conflict copy is made, and the other
    /// device gets the bytes that were acknowledged.
    @Test func aDaemonKilledDuringAnUploadLosesNothing() throws {
        let a = try MountFixture(extra: "--upload-delay 0 --poll-interval 1",
                                 daemonEnv: ["UBIQ_STORE_WRITE_RATE": "8M"])
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--poll-interval 1")
        defer { b.cleanup() }
        for round in 1 ... 2 {
            // 32 MiB at 8 MiB/s: four seconds on the wire, progress reported every 8 MiB.
            let w = a.sh("head -c 32M /dev/urandom > big.bin && sync big.bin && sha256sum big.bin")
            expectOK(w)
            let sum = String(w.out.prefix(64))
            let midway = eventually(a, "p=$(getfattr --only-values -n user.ubiq.percent-uploaded big.bin) && [ \"$p\" -gt 0 ] && [ \"$p\" -lt 100 ]")
            expectOK(midway, "round \(round): the upload is under way: \(a.statusOf("big.bin"))")
            #expect(a.signalDaemon(SIGKILL))
            shell("fusermount3 -u -z '\(a.mnt)'")
            try a.mount()
            expectOK(a.sh("[ \"$(sha256sum < big.bin | cut -c1-64)\" = \(sum) ]"), "round \(round): the file is whole after the restart")
            expectOK(eventually(a, "[ \"$(getfattr --only-values -n user.ubiq.status big.bin)\" = current ]", seconds: 60),
                     "round \(round): the upload finished: \(a.statusOf("big.bin"))")
            expectOK(eventually(b, "[ \"$(sha256sum < big.bin | cut -c1-64)\" = \(sum) ]", seconds: 30), "round \(round): B has the same bytes")
            for m in [a, b] {
                expectOK(m.sh("[ \"$(ls)\" = big.bin ]"), "round \(round): no conflict copy: \(m.sh("ls").out)")
            }
        }
    }

    /// SIGKILL while a device applies a stream of another device's changes, then mount
    /// again: every file arrives, once, with its bytes.
    @Test func aDaemonKilledWhileApplyingRemoteChangesCatchesUp() throws {
        let a = try MountFixture(extra: "--upload-delay 0 --poll-interval 1")
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--poll-interval 1")
        defer { b.cleanup() }
        let count = 2000
        expectOK(a.sh("mkdir -p many && cd many && for i in $(seq 1 \(count)); do echo \"file $i\" > f$i; done"))
        // Killed once part of the stream has arrived, with more still coming.
        let some = eventually(b, "n=$(ls many 2>/dev/null | wc -l) && [ $n -gt 0 ] && [ $n -lt \(count) ]", seconds: 60)
        expectOK(some, "B is part-way: \(b.sh("ls many | wc -l").out)")
        #expect(b.signalDaemon(SIGKILL))
        shell("fusermount3 -u -z '\(b.mnt)'")
        try b.mount()
        let all = "[ $(ls many | wc -l) = \(count) ] && [ $(ls many | sort -u | wc -l) = \(count) ] && [ \"$(cat many/f1 many/f\(count))\" = \"$(printf 'file 1\\nfile \(count)')\" ]"
        expectOK(eventually(b, all, seconds: 120), "B has everything: \(b.sh("ls many | wc -l").out)")
        expectOK(b.sh("cd many && for i in $(seq 1 \(count)); do [ \"$(cat f$i)\" = \"file $i\" ] || { echo \"f$i: $(cat f$i)\"; exit 1; }; done"))
        expectOK(a.sh("[ $(ls many | wc -l) = \(count) ]"))
    }
}
