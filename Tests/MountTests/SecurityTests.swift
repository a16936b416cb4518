import Foundation
import Testing

/// What a mount keeps to its owner: the state directory and its files, the control socket
/// (by mode, and by the peer's credentials if the modes are opened by hand).
@Suite struct SecurityTests {
    @Test func stateIsTheOwnersOnly() throws {
        let m = try MountFixture(extra: "--upload-delay 0")
        defer { m.cleanup() }
        expectOK(m.sh("echo secret > f && setfattr -n user.note -v private f && \(ubiqBinary) sync . && \(ubiqBinary) kv set k v"))
        // A state folder and files opened to all (a folder made beforehand for an fstab line,
        // files of an older version) are tightened at the next mount.
        expectOK(m.unmount())
        expectOK(shell("chmod 777 \(m.state) \(m.store) && chmod 644 \(m.state)/state.db* \(m.store)/store.db*"))
        try m.mount()
        expectOK(m.sh("echo more > g && \(ubiqBinary) sync ."))
        let r = m.sh("""
            set -e
            cd \(m.state)
            test "$(stat -c %a .)" = 700
            test "$(stat -c %a cache)" = 700
            for f in state.db state.db-wal ubiq.log lock control.sock; do test "$(stat -c %a $f)" = 600 || { echo "$f: $(stat -c %a $f)"; exit 1; }; done
            cd \(m.store)
            test "$(stat -c %a .)" = 700 || { echo "store: $(stat -c %a .)"; exit 1; }
            for f in store.db*; do test "$(stat -c %a $f)" = 600 || { echo "$f: $(stat -c %a $f)"; exit 1; }; done
            """)
        expectOK(r, "modes")
        // As another user, with the folders above opened: neither index can be read.
        expectOK(shell("chmod 755 \(m.base)"))
        for db in [m.store + "/store.db", m.state + "/state.db"] {
            let other = shell("setpriv --reuid=65534 --regid=65534 --clear-groups cat '\(db)' > /dev/null")
            #expect(other.status != 0 && other.err.contains("Permission denied"), "\(db): \(other.err)")
        }
    }

    /// Even with the modes opened by hand, another user's connection is refused (SO_PEERCRED).
    @Test func theControlSocketAnswersItsOwnerOnly() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let sock = m.state + "/control.sock"
        expectOK(shell("chmod 711 '\(m.base)' '\(m.state)' && chmod 666 '\(sock)'"))
        let client = """
            import json, socket, sys, time
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            time.sleep(0.3)  # a slow client still reads why it is refused (not EPIPE on its write)
            s.sendall(b'{"op":"status"}\\n'); print(s.recv(4096).decode())
            """
        let script = m.base + "/client.py"
        try client.write(toFile: script, atomically: true, encoding: .utf8)
        expectOK(shell("chmod 644 '\(script)'"))
        let other = shell("setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 '\(script)' '\(sock)'")
        #expect(other.out.contains("\"ok\":false") && other.out.contains("belongs to uid"), "\(other.out)\(other.err)")
        let owner = shell("python3 '\(script)' '\(sock)'")
        #expect(owner.out.contains("\"ok\":true"), "\(owner.out)\(owner.err)")
        let log = (try? String(contentsOfFile: m.state + "/ubiq.log", encoding: .utf8)) ?? ""
        #expect(log.contains("refused a connection from uid 65534"))
    }

    /// Root's own mount (no allow_other) goes without `default_permissions`, whose check costs
    /// the kernel a GETATTR of a folder after each create and unlink in it: root keeps exactly
    /// root's rights (a file with no x bit still does not run), and a root process that took
    /// another file-system uid (setfsuid) is refused what a disk would check, not let in
    /// unchecked. With allow_other the kernel checks modes and owners as before.
    @Test func rootsOwnMountLeavesOutTheKernelsCheckAndNothingElse() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let superOptions = { (mnt: String) in shell("awk -v m='\(mnt)' '$5 == m { print $NF }' /proc/self/mountinfo").out }
        #expect(!superOptions(m.mnt).contains("default_permissions"), "\(superOptions(m.mnt))")
        let r = m.sh("""
            printf secret > secret && chmod 000 secret && cat secret && echo ' root-reads-000'
            printf '#!/bin/sh\\necho ran\\n' > script && chmod 644 script
            { ./script 2>&1 || true; } | grep -q 'Permission denied' && echo noexec-ok
            test -x script || echo not-x-ok
            chmod 744 script && ./script
            chmod 600 secret && chown 1234:1234 secret && echo chown-ok
            python3 - <<'PY'
            import ctypes, errno, os
            libc = ctypes.CDLL(None, use_errno=True)
            libc.setfsgid(65534); libc.setfsuid(65534)
            tries = [("read", lambda: open("secret").read()), ("write", lambda: open("script", "a")),
                     ("create", lambda: open("new", "w")), ("unlink", lambda: os.unlink("script")),
                     ("mkdir", lambda: os.mkdir("d")), ("chmod", lambda: os.chmod("script", 0o777))]
            for what, f in tries:
                try:
                    f(); print(what, "allowed")
                except OSError as e:
                    print(what, errno.errorcode[e.errno])
            PY
            ls
            """)
        expectOK(r)
        #expect(r.out.contains("secret root-reads-000"))
        #expect(r.out.contains("noexec-ok") && r.out.contains("not-x-ok") && r.out.contains("ran\n"))
        #expect(r.out.contains("chown-ok"))
        for what in ["read", "write", "create", "unlink", "mkdir", "chmod"] {
            #expect(r.out.contains("\(what) EACCES") || r.out.contains("\(what) EPERM"), "\(what): \(r.out)")
        }
        #expect(!r.out.contains("new") && r.out.contains("script"), "\(r.out)")

        let shared = try MountFixture(extra: "-o allow_other")
        defer { shared.cleanup() }
        #expect(superOptions(shared.mnt).contains("default_permissions"), "\(superOptions(shared.mnt))")
    }
}

/// A state directory someone changed by hand: what is in the store is never lost for it.
@Suite struct TamperedStateTests {
    /// A crash never removes a cache file. When one is gone for a file whose bytes are in the
    /// store, the file is a placeholder again (before: an empty file, uploaded over the store's).
    @Test func aRemovedCacheFileComesBackFromTheStore() throws {
        let m = try MountFixture(extra: "--upload-delay 0")
        defer { m.cleanup() }
        expectOK(m.sh("head -c 300000 /dev/urandom > data.bin && sha256sum data.bin > ../data.sum && \(ubiqBinary) sync ."))
        let ino = m.sh("stat -c %i data.bin").out.trimmingCharacters(in: .whitespacesAndNewlines)
        expectOK(m.unmount())
        expectOK(shell("rm '\(m.state)/cache/\(ino)'"), "remove the cache file")
        try m.mount()
        #expect(m.sh("getfattr --only-values -n user.ubiq.status data.bin").out == "placeholder")
        expectOK(m.sh("sha256sum -c ../data.sum"), "the store's bytes")
        let log = (try? String(contentsOfFile: m.state + "/ubiq.log", encoding: .utf8)) ?? ""
        #expect(log.contains("the cache file of inode \(ino) is gone"))
        // And nothing went up over the store's version: a second device reads the same bytes.
        let b = try MountFixture(store: m.store, name: "device-b")
        defer { b.cleanup() }
        expectOK(b.sh("sha256sum -c ../../\(URL(fileURLWithPath: m.base).lastPathComponent)/data.sum"))
    }
}
