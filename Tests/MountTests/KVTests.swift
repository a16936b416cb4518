import Foundation
import Testing
import TestSupport

/// `ubiq kv` on a store, as two devices (two users' state homes), with a mount of the store
/// beside it: values, errors, last writer wins, watch, and the kv objects never showing as files.
@Suite struct KVTests {
    @Test func setGetListRemoveAndErrors() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let store = "--store dir:\(m.store)"
        expectOK(m.ubiq("kv set \(store) theme dark"))
        expectOK(m.ubiq("kv set \(store) --type json window '{\"w\": 800}'"))
        expectOK(m.ubiq("kv set \(store) --type number zoom 1.5"))
        expectOK(m.ubiq("kv set \(store) --type bool sound false"))
        expectOK(m.ubiq("kv set \(store) --type bytes icon AAEC"))
        #expect(m.ubiq("kv get \(store) theme").out == "dark\n")
        #expect(m.ubiq("kv get \(store) window").out == "{\"w\":800}\n")
        #expect(m.ubiq("kv get \(store) zoom").out == "1.5\n")
        #expect(m.ubiq("kv get \(store) --json sound").out.contains("\"type\":\"bool\",\"value\":false"))
        #expect(m.ubiq("kv list \(store)").out == "icon\tAAEC\nsound\tfalse\ntheme\tdark\nwindow\t{\"w\":800}\nzoom\t1.5\n")
        expectOK(m.ubiq("kv remove \(store) theme"))
        let gone = m.ubiq("kv get \(store) theme")
        #expect(gone.status == 1 && gone.err == "ubiq: no value for \"theme\"\n")
        let cases: [(String, String)] = [
            ("set \(String(repeating: "k", count: 65)) v", "at most 64"),
            ("set --type number n twelve", "is not a number"),
            ("set --type json j '{'", "not valid JSON"),
            ("set --type colour c red", "unknown type"),
        ]
        for (args, says) in cases {
            let r = m.ubiq("kv \(args.replacingOccurrences(of: "set ", with: "set \(store) "))")
            #expect(r.status == 1 && r.err.contains(says) && r.err.split(separator: "\n").count == 1, "\(args): \(r.err)")
        }
        let nowhere = m.ubiq("kv get --store dir:\(m.base)/no-store k")
        #expect(nowhere.status == 1 && nowhere.err.contains("no store at"), "\(nowhere.err)")
        // The mount holds no trace of them, and nobody can make the name they live under.
        expectOK(m.sh("test -z \"$(ls -A)\""), "kv objects showed as files")
        let mk = m.sh("mkdir .ubiquity")
        #expect(mk.status != 0 && mk.err.contains("Operation not permitted"), "\(mk.err)")
        expectOK(m.sh("mkdir sub && mkdir sub/.ubiquity"), "the name is reserved at the root only")
    }

    /// Two devices setting one key at once end with one value, the same for both; a watch on
    /// one device prints the other's changes.
    /// Values from a file or standard input: past what a command line holds (~128 KiB), up to
    /// the store's 1 MiB, through a mount's daemon and straight to the store; over it, one line.
    @Test func valuesFromAFileOrStandardInput() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let big = m.base + "/big.txt"
        expectOK(shell("head -c 600000 /dev/zero | tr '\\0' x > \(big)"))
        expectOK(m.ubiq("kv set --mount \(m.mnt) long --file \(big)"))
        #expect(m.ubiq("kv get --mount \(m.mnt) long").out == String(repeating: "x", count: 600_000) + "\n")
        expectOK(shell("printf '{\"w\": 800}\\n' | \(ubiqBinary) kv set --store dir:\(m.store) --type json window -", env: m.env))
        #expect(m.ubiq("kv get --store dir:\(m.store) window").out == "{\"w\":800}\n")
        expectOK(shell("printf '\\000\\001\\002' > \(m.base)/raw && \(ubiqBinary) kv set --store dir:\(m.store) --type bytes icon --file \(m.base)/raw", env: m.env))
        #expect(m.ubiq("kv get --store dir:\(m.store) icon").out == "AAEC\n")
        expectOK(shell("head -c 1100000 /dev/zero > \(m.base)/huge"))
        let over = m.ubiq("kv set --store dir:\(m.store) --type bytes huge --file \(m.base)/huge")
        #expect(over.status == 1 && over.err.contains("over 1048576 bytes") && over.err.split(separator: "\n").count == 1, "\(over.err)")
        let both = m.ubiq("kv set --store dir:\(m.store) k v --file \(big)")
        #expect(both.status == 1 && both.err.contains("not both"), "\(both.err)")
        let neither = m.ubiq("kv set --store dir:\(m.store) k")
        #expect(neither.status == 1 && neither.err.contains("give a value"), "\(neither.err)")
    }

    @Test func twoDevicesConvergeAndWatch() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let store = "--store dir:\(m.store)"
        let kv = { (sub: String) in "\(ubiqBinary) kv \(sub) \(store)" }
        let devA = "XDG_STATE_HOME=\(m.base)/dev-a", devB = "XDG_STATE_HOME=\(m.base)/dev-b"
        let watchOut = m.base + "/watch.jsonl"
        expectOK(shell("\(devA) \(kv("set")) color red"))
        let watcher = Process()
        watcher.executableURL = URL(fileURLWithPath: "/bin/bash")
        watcher.arguments = ["-c", "\(devA) exec \(kv("watch")) --interval 0.3 > \(watchOut)"]
        try watcher.run()
        defer { watcher.terminate(); watcher.waitUntilExit() }
        expectOK(shell("""
            for i in $(seq 1 8); do \(devA) \(kv("set")) race a$i & \(devB) \(kv("set")) race b$i & done; wait
            """), "racing sets")
        let a = shell("\(devA) \(kv("get")) race"), b = shell("\(devB) \(kv("get")) race")
        #expect(a.status == 0 && a.out == b.out, "devices disagree: \(a.out) \(b.out)")
        expectOK(shell("\(devB) \(kv("set")) color blue && \(devB) \(kv("remove")) race"))
        var lines: [String] = []
        waitUntil(seconds: 15, every: 0.2) {
            lines = ((try? String(contentsOfFile: watchOut, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
            return lines.contains(where: { $0.contains("\"changed\"") && $0.contains("blue") }) && lines.contains(where: { $0.contains("\"removed\":true") })
        }
        #expect(lines.first?.contains("\"reason\":\"initial-sync\"") == true && lines.first?.contains("red") == true, "\(lines)")
        #expect(lines.contains { $0.contains("\"reason\":\"changed\"") && $0.contains("\"color\"") && $0.contains("blue") }, "\(lines)")
        #expect(lines.contains { $0.contains("\"race\"") && $0.contains("\"removed\":true") }, "\(lines)")
    }

    /// Through a mount: a set is kept by the mount and sent; another mount of the store gets
    /// it with its feed, and its watch says so.
    @Test func throughMountsAndTheirWatch() throws {
        let a = try MountFixture(extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--poll-interval 1")
        defer { b.cleanup() }
        let watchOut = b.base + "/watch.jsonl"
        let watcher = Process()
        watcher.executableURL = URL(fileURLWithPath: "/bin/bash")
        watcher.arguments = ["-c", "cd \(b.mnt) && exec \(ubiqBinary) kv watch > \(watchOut)"]
        try watcher.run()
        defer { watcher.terminate(); watcher.waitUntilExit() }
        expectOK(a.sh("\(ubiqBinary) kv set theme dark && \(ubiqBinary) kv set --type json win '[1,2]'"))
        #expect(a.sh("\(ubiqBinary) kv get theme").out == "dark\n")
        expectOK(eventually(b, "test \"$(\(ubiqBinary) kv get theme)\" = dark"), "B has A's value")
        #expect(b.sh("\(ubiqBinary) kv list").out == "theme\tdark\nwin\t[1,2]\n")
        #expect(shell("\(ubiqBinary) kv get --store dir:\(a.store) win").out == "[1,2]\n", "not in the store")
        var text = ""
        waitUntil(seconds: 10, every: 0.2) {
            text = (try? String(contentsOfFile: watchOut, encoding: .utf8)) ?? ""
            return text.contains("\"win\"")
        }
        #expect(text.contains("\"reason\":\"changed\"") && text.contains("\"theme\"") && text.contains("\"win\""), "\(text)")
        let long = a.sh("\(ubiqBinary) kv set \(String(repeating: "k", count: 65)) v")
        #expect(long.status == 1 && long.err.contains("at most 64"), "\(long.err)")
    }

    /// A set made while the store is away is kept in the mount's state database: it survives
    /// SIGKILL of the daemon, and goes to the store once it is back.
    @Test func aSetSurvivesSIGKILLWhileOffline() throws {
        let flag = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-kv-offline-\(UUID().uuidString)").path
        defer { unlink(flag) }
        let m = try MountFixture(extra: "--upload-delay 0 --poll-interval 1", daemonEnv: ["UBIQ_STORE_OFFLINE_FLAG": flag])
        defer { m.cleanup() }
        FileManager.default.createFile(atPath: flag, contents: nil)
        expectOK(m.sh("\(ubiqBinary) kv set note 'written offline'"), "set while offline")
        #expect(shell("\(ubiqBinary) kv get --store dir:\(m.store) note").status == 1, "reached the store while it was away")
        #expect(m.signalDaemon(SIGKILL))
        try m.mount()
        #expect(m.sh("\(ubiqBinary) kv get note").out == "written offline\n")
        unlink(flag)
        expectOK(eventually(m, "test \"$(\(ubiqBinary) kv get --store dir:\(m.store) note)\" = 'written offline'"), "sent once back")
    }
}
