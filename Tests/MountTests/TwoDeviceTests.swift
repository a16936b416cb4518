import Foundation
import Testing
import TestSupport

/// Two live mounts of one store: two devices, each seeing the other's changes while both
/// are mounted (the change feed), through the kernel's caches.
@Suite(.serialized) struct TwoDeviceTests {
    /// Starts `ubiq ARGS` with its output going to the file `output`; does not wait.
    func spawn(_ args: [String], output: String) -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: ubiqBinary)
        p.arguments = args
        FileManager.default.createFile(atPath: output, contents: nil)
        p.standardOutput = FileHandle(forWritingAtPath: output)
        p.standardError = p.standardOutput
        p.standardInput = FileHandle.nullDevice
        try? p.run()
        return p
    }

    @Test func changesOnOneMountAppearOnTheOther() throws {
        let a = try MountFixture(extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--poll-interval 1")
        defer { b.cleanup() }
        // B looks at the directory first, so the kernel caches its answer ("nothing there").
        expectOK(b.sh("ls -la . > /dev/null; [ ! -e note ]"))
        expectOK(a.sh("echo first > note && mkdir -p dir && echo x > dir/gone && chmod 600 note"))
        expectOK(eventually(b, "[ \"$(cat note)\" = first ] && [ -f dir/gone ] && [ $(stat -c %a note) = 600 ]"), "additions")
        // B has the bytes (and the kernel its pages): an edit on A must still show.
        expectOK(b.sh("cat note > /dev/null"))
        expectOK(a.sh("echo second, longer > note && rm dir/gone"))
        expectOK(eventually(b, "[ \"$(cat note)\" = 'second, longer' ] && [ ! -e dir/gone ] && [ -z \"$(ls dir)\" ]"), "edit and delete")
        // And back the other way, at once with `ubiq sync`.
        expectOK(b.sh("echo from b > reply"))
        expectOK(eventually(a, "\(ubiqBinary) sync . > /dev/null && [ \"$(cat reply)\" = 'from b' ]"), "reply")
        #expect(a.sh("\(ubiqBinary) sync .").out.hasPrefix("synced "))
    }

    /// `>>` on a file another device changed since this one looked at it: the line goes after
    /// the other device's lines, not over them at the size the kernel last learned (a longer
    /// version), nor after a hole of zeros (a shorter one). On both devices the file reads the
    /// same, line by line. Whether the kernel asks for the size again before the append depends
    /// on what it still holds of the name (its timeouts), so the turns are taken a few times.
    /// Also with `--writeback-cache` asked for: it is ignored now (with it the kernel keeps its
    /// own size, and the other device's line was lost every time).
    @Test(arguments: ["", "--writeback-cache"])
    func anAppendGoesAfterAnotherDevicesVersion(mode: String) throws {
        let a = try MountFixture(extra: "--upload-delay 0 --poll-interval 1 \(mode)")
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--upload-delay 0 --poll-interval 1 \(mode)")
        defer { b.cleanup() }
        let sync = "\(ubiqBinary) sync \(a.mnt) > /dev/null && \(ubiqBinary) sync \(b.mnt) > /dev/null"
        expectOK(a.sh("printf 'one\\n' > f && \(sync)"))
        expectOK(eventually(b, "[ \"$(cat f)\" = one ]"))
        var lines = "one\n"
        for turn in 1 ... 5 {
            // B looks at the file: the kernel learns its size and keeps its pages.
            expectOK(b.sh("stat f > /dev/null && cat f > /dev/null"))
            expectOK(a.sh("printf 'a\(turn)\\n' >> f && \(sync)"))
            expectOK(b.sh("printf 'b\(turn)\\n' >> f && \(sync) && \(sync)"))
            lines += "a\(turn)\nb\(turn)\n"
            let onB = b.sh("cat f").out, onA = a.sh("cat f").out
            #expect(onB == lines && onA == lines, "turn \(turn), over a longer version: B has \(onB.debugDescription), A \(onA.debugDescription)")
            if onB != lines || onA != lines { return }
        }
        // A shorter version: A writes the file anew; B, which knew it longer, appends.
        expectOK(b.sh("stat f > /dev/null && cat f > /dev/null"))
        expectOK(a.sh("printf 'new\\n' > f && \(sync)"))
        expectOK(b.sh("printf 'b, after\\n' >> f && \(sync) && \(sync)"))
        let onB = b.sh("cat f").out, onA = a.sh("cat f").out
        #expect(onB == "new\nb, after\n" && onA == onB, "over a shorter version: B has \(onB.debugDescription), A \(onA.debugDescription)")
    }

    /// `ubiq watch` on one device sees what another device does; `ubiq query --watch` sees
    /// its results change; the control socket is its owner's alone.
    @Test func watchAndQuerySeeAnotherDevicesChanges() throws {
        let a = try MountFixture(extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--poll-interval 1")
        defer { b.cleanup() }
        #expect(shell("stat -c '%a %U %F' \(b.state)/control.sock").out == "600 root socket\n")
        expectOK(b.sh("mkdir -p docs"))
        let watch = b.base + "/watch.out", query = b.base + "/query.out"
        // Both streams run in the background, and are stopped at the end.
        let streams = [spawn(["watch", b.mnt + "/docs"], output: watch),
                       spawn(["query", "--name", "*.txt", "--watch", "--interval", "0.3", b.mnt], output: query)]
        defer { for p in streams where p.isRunning { p.terminate() } }
        // Both streams listen once a change here reaches them (written again until it does).
        expectOK(eventually(b, "date +%s%N > docs/ready.txt; grep -q 'docs/ready.txt' \(watch) && grep -q '\"change\":\"changed\".*ready.txt' \(query)"),
                 "the streams never started")
        expectOK(a.sh("mkdir -p docs && echo hello > docs/from-a.txt && echo x > docs/other.bin"))
        let seen = eventually(b, "grep -q '\"event\":\"changed-remotely\".*docs/from-a.txt' \(watch) && grep -q '\"change\":\"added\".*from-a.txt' \(query)")
        let outputs = { "watch: \((try? String(contentsOfFile: watch, encoding: .utf8)) ?? "-") query: \((try? String(contentsOfFile: query, encoding: .utf8)) ?? "-") log: \(shell("tail -5 \(b.state)/ubiq.log; ls -la \(b.mnt)/docs").out)" }
        expectOK(seen, "events from another device; \(outputs())")
        expectOK(a.sh("rm docs/from-a.txt"))
        expectOK(eventually(b, "grep -q '\"event\":\"deleted\".*docs/from-a.txt' \(watch) && grep -q '\"change\":\"removed\".*from-a.txt' \(query)"), "deletes; \(outputs())")
        // The query stream never mentions what does not match it.
        #expect(!(((try? String(contentsOfFile: query, encoding: .utf8)) ?? "").contains("other.bin")))
        // And a query answers at once, from the database.
        let q = b.ubiq("query --type file --json \(b.mnt)")
        expectOK(q)
        #expect(q.out.contains("other.bin") && !q.out.contains("from-a.txt"), "\(q.out)")
        #expect(b.ubiq("query --sort nonsense \(b.mnt)").status != 0)
        // Sizes for people, as printf's %.1f and %.0f round them (half to even).
        let sizes: [(Int, String)] = [(1000, "1000 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (1587, "1.5 KiB"),
                                      (1588, "1.6 KiB"), (10188, "9.9 KiB"), (10189, "10.0 KiB"), (10240, "10 KiB"),
                                      (11776, "12 KiB"), (12800, "12 KiB"), (3 << 20, "3.0 MiB")]
        expectOK(b.sh("mkdir sizes && cd sizes && " + sizes.map { "truncate -s \($0.0) s\($0.0)" }.joined(separator: " && ")))
        let listed = b.ubiq("query --type file \(b.mnt)/sizes")
        for (n, shown) in sizes {
            #expect(listed.out.split(separator: "\n").contains { $0.contains(" \(shown) ") && $0.hasSuffix("/s\(n)") }, "\(n): \(listed.out)")
        }
    }

    /// A conflict is announced with both names: a `ubiq watch` event on every device (here A,
    /// whose version the other device's upload met), and a desktop notification where the
    /// daemon has a session bus (a private one here, its Notify calls read by dbus-monitor).
    @Test func aConflictIsAnnouncedWithBothNames() throws {
        let bus = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-bus-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: bus, withIntermediateDirectories: true)
        // A session bus of the test's own, a process it owns (one that forks keeps an fd of
        // Foundation's Process open, which then never sees its parent end).
        let said = bus + "/said"
        _ = FileManager.default.createFile(atPath: said, contents: nil)
        let busDaemon = Process()
        busDaemon.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-daemon")
        busDaemon.arguments = ["--session", "--nofork", "--print-address=1", "--address=unix:path=\(bus)/bus"]
        busDaemon.standardOutput = FileHandle(forWritingAtPath: said)
        busDaemon.standardInput = FileHandle.nullDevice
        busDaemon.standardError = FileHandle.nullDevice  // (inherited, it held swift test's pipe open)
        try busDaemon.run()
        defer { busDaemon.terminate(); try? FileManager.default.removeItem(atPath: bus) }
        var address = ""
        #expect(waitUntil(seconds: 30, every: 0.05) {
            address = ((try? String(contentsOfFile: said, encoding: .utf8)) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
            return !address.isEmpty
        }, "dbus-daemon said no address")
        let calls = bus + "/calls"
        _ = FileManager.default.createFile(atPath: calls, contents: nil)
        let monitor = Process()
        monitor.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-monitor")
        monitor.arguments = ["--address", address, "type='method_call',interface='org.freedesktop.Notifications'"]
        monitor.standardOutput = FileHandle(forWritingAtPath: calls)
        monitor.standardError = FileHandle.nullDevice
        try monitor.run()
        defer { monitor.terminate() }

        let a = try MountFixture(extra: "--upload-delay 0 --poll-interval 1", daemonEnv: ["DBUS_SESSION_BUS_ADDRESS": address])
        defer { a.cleanup() }
        let offline = a.base + "/b-offline"
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--upload-delay 0 --poll-interval 1",
                                 daemonEnv: ["UBIQ_STORE_OFFLINE_FLAG": offline, "UBIQ_NOTIFY": "0"])
        defer { b.cleanup() }
        let watch = a.base + "/watch.out"
        let watching = spawn(["watch", a.mnt], output: watch)
        defer { if watching.isRunning { watching.terminate() } }
        expectOK(a.sh("printf 'base\\n' > plan.txt"))
        expectOK(eventually(b, "[ \"$(cat plan.txt)\" = base ]"), "the file reaches B")
        // The watch listens once a change here reaches it.
        expectOK(eventually(a, "touch ready; grep -q '/ready\"' \(watch)"), "the watch never started")
        _ = FileManager.default.createFile(atPath: offline, contents: nil)
        expectOK(b.sh("printf 'from B\\n' > plan.txt"))
        expectOK(a.sh("printf 'from A\\n' > plan.txt"))
        expectOK(eventually(a, "[ \"$(getfattr --only-values -n user.ubiq.status plan.txt)\" = current ]"))
        try FileManager.default.removeItem(atPath: offline)
        expectOK(eventually(a, "ls | grep -q '^plan (conflict .*)\\.txt$'", seconds: 30), "the copy reaches A: \(a.sh("ls").out)")
        let copy = a.sh("ls | grep '^plan (conflict '").out.trimmingCharacters(in: .whitespacesAndNewlines)
        let told = "grep -F '\"event\":\"conflict\"' \(watch) | grep -F '\"path\":\"\(a.mnt)/plan.txt\"' | grep -qF '\"copy\":\"\(a.mnt)/\(copy)\"'"
        expectOK(eventually(a, told), "ubiq watch: \((try? String(contentsOfFile: watch, encoding: .utf8)) ?? "")")
        let shown = "grep -q 'member=Notify' \(calls) && grep -qF 'Conflict: plan.txt' \(calls) && grep -qF '\(copy)' \(calls)"
        expectOK(eventually(a, shown), "the desktop was told: \((try? String(contentsOfFile: calls, encoding: .utf8)) ?? "")")
    }

    @Test func syncOutsideAMountIsAClearError() throws {
        let r = shell("\(ubiqBinary) sync /tmp")
        #expect(r.status != 0)
        #expect(r.err.contains("not in a ubiq mount"), "\(r.err)")
        for cmd in ["query /tmp", "watch /tmp"] {
            let e = shell("\(ubiqBinary) \(cmd)")
            #expect(e.status != 0 && e.err.contains("not in a ubiq mount"), "\(cmd): \(e.err)")
        }
    }
}
