import Foundation
import Testing

/// Real mounts, real shell tools. Serialized: each mounts its own store, and
/// two cores are better spent on one at a time.
@Suite(.serialized) struct ShellToolTests {
    @Test func copyATreeWithLinksAndABigFileThenDiff() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let src = m.base + "/src"
        expectOK(shell("""
            mkdir -p \(src)/a/b/c \(src)/empty-dir
            echo hello > \(src)/a/hello.txt
            : > \(src)/a/empty
            printf 'line1\\nline2\\n' > \(src)/a/b/c/deep.txt
            ln -s hello.txt \(src)/a/link-to-hello
            ln -s /nonexistent/target \(src)/dangling
            ln \(src)/a/hello.txt \(src)/a/b/hard-hello
            chmod 600 \(src)/a/b/c/deep.txt
            chmod 750 \(src)/a/b
            mkfifo \(src)/a/fifo
            head -c 100M /dev/urandom > \(src)/big.bin
            touch -d '2001-02-03 04:05:06' \(src)/a/hello.txt
            """), "make source tree")
        expectOK(m.sh("cp -a \(src)/. ."), "cp -a")
        // diff cannot compare FIFOs (it reports them as different): they are checked by stat below.
        expectOK(m.sh("diff -r --no-dereference -x fifo \(src) ."), "diff -r")
        // Modes, times, link targets and hard links survived the copy.
        let r = m.sh("stat -c '%n %a %F %Y' a/b a/b/c/deep.txt a/fifo a/hello.txt && readlink dangling && [ $(stat -c %i a/hello.txt) = $(stat -c %i a/b/hard-hello) ] && stat -c %h a/hello.txt")
        expectOK(r)
        #expect(r.out.contains("a/b 750 directory"))
        #expect(r.out.contains("a/b/c/deep.txt 600 regular file"))
        #expect(r.out.contains("a/fifo 644 fifo") || r.out.contains("fifo"))
        #expect(r.out.contains("a/hello.txt 644 regular file 981173106"))
        #expect(r.out.contains("/nonexistent/target"))
        #expect(r.out.hasSuffix("2\n"))
        let sums = shell("cd \(src) && sha256sum big.bin").out
        #expect(m.sh("sha256sum big.bin").out == sums)
    }

    @Test func moveRemoveChmodTouchTruncateAppendSed() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        expectOK(m.sh("""
            mkdir -p x/y z
            echo one > x/y/f
            mv x/y/f z/g
            [ ! -e x/y/f ] && [ "$(cat z/g)" = one ]
            mv x/y z/
            [ -d z/y ] && [ ! -e x/y ]
            echo two >> z/g
            [ "$(cat z/g)" = "$(printf 'one\\ntwo')" ]
            sed -i 's/two/TWO/' z/g
            [ "$(tail -1 z/g)" = TWO ]
            chmod 640 z/g && [ "$(stat -c %a z/g)" = 640 ]
            touch -d '1999-12-31 23:59:59 UTC' z/g && [ "$(stat -c %Y z/g)" = 946684799 ]
            truncate -s 3 z/g && [ "$(cat z/g)" = one ]
            truncate -s 10000 z/g && [ "$(stat -c %s z/g)" = 10000 ]
            mkdir -p deep/a/b/c && touch deep/a/b/c/file
            rm -rf deep x
            [ ! -e deep ] && [ "$(ls)" = z ]
            """), "shell workload")
    }

    /// `rewinddir` shows the names the folder holds now (POSIX), through the kernel: a name
    /// made and one removed after the first pass.
    @Test func aRewoundDirectoryShowsItsNamesNow() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let r = m.sh(#"touch old gone && perl -e 'opendir(D, ".") or die; my @a = sort grep { !/^\./ } readdir(D); open(F, ">new") or die; close F; unlink "gone" or die; rewinddir(D); my @b = sort grep { !/^\./ } readdir(D); print join(",", @a), " ", join(",", @b), "\n"'"#)
        #expect(r.out == "gone,old new,old\n", "\(r.out)\(r.err)")
    }

    /// A sparse file tells of its holes as on ext4: `st_blocks` leaves them out, SEEK_DATA and
    /// SEEK_HOLE find them (50 KB written at 1.6 MB counted 3,300 blocks, and SEEK_DATA said 0);
    /// `truncate -s` makes one hole. On another device the file is a placeholder: no blocks,
    /// and all data to SEEK_DATA, so `cp`, which skips what it is told is a hole, copies every
    /// byte of it (a placeholder told to be all hole would be copied as zeros).
    @Test func holesAreToldAndAPlaceholderIsAllData() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let seek = #"python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); print(os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE))'"#
        let r = m.sh("""
            dd if=/dev/urandom of=s bs=1024 count=50 seek=1600 status=none && cp s \(m.base)/ref
            stat -c %b s; \(seek) s
            truncate -s 64M t && stat -c %b t
            head -c 300000 /dev/urandom > d && stat -c %b d
            """)
        let out = r.out.split(separator: "\n").map(String.init)
        #expect(out.count == 4, "\(r.out)\(r.err)")
        guard out.count == 4 else { return }
        #expect((Int(out[0]) ?? 9999) <= 120, "a 50 KB extent: \(out[0]) blocks")
        #expect(out[1] == "1638400 0", "the data at 1.6 MB, a hole from 0: \(out[1])")
        #expect(out[2] == "0", "truncate -s: one hole")
        #expect((Int(out[3]) ?? 0) >= 586, "a file of data: \(out[3]) blocks")
        expectOK(m.unmount())
        let b = try MountFixture(store: m.store, name: "device-b")
        defer { b.cleanup() }
        let p = b.sh("stat -c %b s; \(seek) s; cp s \(b.base)/copy && cmp s \(m.base)/ref && cmp \(b.base)/copy \(m.base)/ref && echo same")
        #expect(p.out.hasPrefix("0\n0 1689600\n") && p.out.hasSuffix("same\n"), "\(p.out)\(p.err)")
    }

    /// A file handle (`name_to_handle_at`) opens its file after the kernel forgot it, a
    /// remount between (`open_by_handle_at`, as an NFS export does), while the file has a
    /// name; then ESTALE, also once a new file came after it (its number is not given again).
    @Test func fileHandlesOutliveARemount() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let tool = packageRoot.appendingPathComponent("Tests/MountTests/tools/handles.py").path
        let made = m.sh("mkdir d && echo deep > d/g && echo hello > f && ln f h && python3 \(tool) get f d/g d")
        expectOK(made)
        let handles = made.out.split(separator: "\n").map(String.init)
        #expect(handles.count == 3, "\(made.out)\(made.err)")
        guard handles.count == 3 else { return }
        let (f, g, d) = (handles[0], handles[1], handles[2])
        func open(_ h: String) -> String { m.sh("python3 \(tool) open \(m.mnt) \(h)").out }
        #expect(open(f) == "hello\n", "in the kernel's cache")
        expectOK(m.unmount())
        try m.mount()
        #expect(open(f) == "hello\n", "after a remount")
        #expect(open(g) == "deep\n", "a file in a folder")
        #expect(open(d).hasPrefix("error EISDIR"), "a folder opens as one (read fails): \(open(d))")
        expectOK(m.sh("mv d/g d/moved && rm f"))
        expectOK(m.unmount())
        try m.mount()
        #expect(open(g) == "deep\n", "a rename keeps the handle")
        #expect(open(f) == "hello\n", "another name (h) still holds it")
        expectOK(m.sh("rm h"))
        expectOK(m.unmount())
        try m.mount()
        expectOK(m.sh("echo other > n"))
        #expect(open(f) == "error ESTALE\n", "gone: \(open(f))")
    }

    /// A read moves a file's access time as the mount's option says: `relatime` (the default:
    /// when older than the last change), `strictatime` (every read), `noatime` (never; an exec
    /// is a read). Each read comes after a remount, so that it reaches ubiq, not the kernel's
    /// cache; the time a remount keeps is the one written at unmount.
    @Test func accessTimesFollowTheMountsOption() throws {
        for (option, moves) in [("", [true, false]), ("-o relatime", [true, false]), ("-o strictatime", [true, true]),
                                ("-o noatime", [false, false])] {
            let m = try MountFixture(extra: option)
            defer { m.cleanup() }
            let made = m.sh("printf '#!/bin/sh\\nexit 0\\n' > x && chmod +x x && touch -a -d '2020-01-01 00:00:00' x && stat -c %X x")
            expectOK(made)
            var times = [made.out.trimmingCharacters(in: .whitespacesAndNewlines)]
            for read in ["./x", "cat x > /dev/null"] {
                expectOK(m.unmount())
                try m.mount()
                let r = m.sh("sleep 1.1; \(read) && stat -c %X x")
                expectOK(r)
                times.append(r.out.trimmingCharacters(in: .whitespacesAndNewlines))
            }
            #expect(times[0] == "1577836800", "\(option): touch -a sets it")
            for i in 0 ..< 2 {
                #expect((times[i + 1] != times[i]) == moves[i], "\(option), read \(i + 1): \(times)")
            }
        }
    }

    /// The kernel drops a file's cached pages only when ubiq asks (another device's version,
    /// an eviction), not when a write here moved its mtime: with the kernel's own invalidation
    /// (auto_inval_data) every write emptied the file's cache for the next open, stat or read,
    /// and one that fell while an append was on its way cached the file's old end with zeros
    /// after it, which a reader of the appended lines read (`scripts/stress-loop`,
    /// docs/reliability.md). Pages counted with fincore(1).
    @Test func aWriteKeepsWhatTheKernelCachedOfTheFile() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let r = m.sh("""
            head -c 1048576 /dev/urandom > f && cat f > /dev/null && fincore -n -o PAGES f
            printf x | dd of=f bs=1 seek=5000 conv=notrunc status=none && echo y >> f && sleep 1.2 && stat f > /dev/null
            fincore -n -o PAGES f
            """)
        let pages = r.out.split(separator: "\n").map { Int($0.trimmingCharacters(in: .whitespaces)) ?? -1 }
        #expect(pages.count == 2 && pages[0] >= 256 && pages[1] >= 255, "pages cached before and after: \(r.out)\(r.err)")
    }

    @Test func tarRoundTripKeepsEveryByte() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let src = m.base + "/tree"
        expectOK(shell("""
            mkdir -p \(src) && cd \(src)
            for d in 1 2 3 4 5; do mkdir -p d$d/sub; for f in 1 2 3 4 5 6 7 8; do head -c $((RANDOM * 7)) /dev/urandom > d$d/sub/f$f; done; done
            ln -s d1/sub/f1 sym
            tar cf \(m.base)/t.tar .
            find . -type f -print0 | sort -z | xargs -0 sha256sum > \(m.base)/sums
            """), "make tree")
        expectOK(m.sh("tar xpf \(m.base)/t.tar && find . -type f -print0 | sort -z | xargs -0 sha256sum > \(m.base)/sums2 && cmp \(m.base)/sums \(m.base)/sums2"), "tar x into mount")
        expectOK(m.sh("tar cf - d1 d2 | (mkdir copy && cd copy && tar xf -) && diff -r d1 copy/d1 && diff -r d2 copy/d2"), "tar c | tar x inside the mount")
    }

    @Test func gitWorksInsideTheMount() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let r = m.sh("""
            git init -q repo && cd repo
            git config user.email t@example.com && git config user.name T
            echo 'print(1)' > main.py && mkdir lib && echo x > lib/a
            git add . && git commit -qm first
            echo 'print(2)' >> main.py
            git status --porcelain
            git commit -qam second && git log --oneline | wc -l
            git gc -q && git fsck --no-progress && git status --porcelain | wc -l
            """)
        expectOK(r, "git")
        #expect(r.out.contains(" M main.py"))
        #expect(r.out.hasSuffix("2\n0\n"))
    }

    /// Copy and backup tools behave as on a local disk: `cp -a`, `cp --preserve=all`,
    /// `rsync -aX` and `tar --xattrs`, into the mount, inside it and out of it, exit as they do
    /// on ext4, and the copies carry the user's own attributes and none of ubiq's status ones
    /// (answered by name, never listed: docs/status.md).
    @Test func copyToolsCarryTheUsersAttributesOnly() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let r = m.sh("""
            T=\(m.base)/copies; L=$T/disk; M=\(m.mnt); mkdir -p $L
            copies() {  # copies() SRC DEST: each tool's exit and error count, then the copies' attributes
              mkdir -p $2
              cp -a $1 $2/cp-a 2>$T/err; echo "cp -a rc=$? errors=$(wc -l < $T/err)"
              cp -r --preserve=all $1 $2/cp-all 2>$T/err; echo "cp --preserve=all rc=$? errors=$(wc -l < $T/err)"
              rsync -aX $1/ $2/rsync/ 2>$T/err; echo "rsync -aX rc=$? errors=$(wc -l < $T/err)"
              mkdir $2/tar && tar --xattrs -cf $T/t.tar -C $1 . 2>$T/err && tar --xattrs -xf $T/t.tar -C $2/tar 2>>$T/err
              echo "tar --xattrs rc=$? errors=$(wc -l < $T/err)"
              (cd $2 && find . | sort && getfattr -R -d -m - . 2>/dev/null | awk '/^# file: /{f=substr($0,9); next} NF{print f" "$0}' | sort)
            }
            for root in $L $M; do
              mkdir $root/src $root/src/d && echo one > $root/src/f && echo two > $root/src/d/g
              setfattr -n user.color -v blue $root/src/f && setfattr -n user.tag -v x $root/src/d
            done
            echo "== inside"; copies $M/src $M/inside
            echo "== inside, disk"; copies $L/src $L/inside
            echo "== out of"; copies $M/src $T/out
            echo "== into"; copies $L/src $M/into
            echo "== end"
            """)
        expectOK(r)
        func section(_ name: String) -> String {
            guard let start = r.out.range(of: "== \(name)\n") else { return "missing" }
            let rest = r.out[start.upperBound...]
            return String(rest[..<(rest.range(of: "\n== ")?.lowerBound ?? rest.endIndex)])
        }
        let disk = section("inside, disk")
        #expect(disk.contains("\ncp-a/f user.color=\"blue\"") && disk.contains("\ntar/d user.tag=\"x\""), "\(disk)")
        #expect(disk.contains("rsync -aX rc=0 errors=0"), "\(disk)")
        for name in ["inside", "out of", "into"] {
            #expect(section(name) == disk, "\(name) the mount differs from a local disk:\n\(section(name))\nlocal disk:\n\(disk)")
        }
        #expect(!r.out.contains("user.ubiq"), "\(r.out)")
    }

    @Test func extendedAttributesThroughGetfattrAndSetfattr() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let r = m.sh("""
            echo data > f && mkdir d
            setfattr -n user.color -v blue f
            setfattr -n user.empty f
            setfattr -n user.dir -v yes d
            getfattr -n user.color --only-values f; echo
            getfattr -d f | grep -c user.
            getfattr -n user.dir --only-values d; echo
            setfattr -x user.color f
            { getfattr -n user.color f 2>&1 || true; } | grep -q 'No such attribute' && echo nodata-ok
            { setfattr -x user.missing f 2>&1 || true; } | grep -q 'No such attribute' && echo remove-nodata-ok
            { setfattr -n system.ubiqtest -v x f 2>&1 || true; } | grep -q 'Operation not supported' && echo enotsup-ok
            { getfattr -n system.posix_acl_access f 2>&1 || true; } | grep -q 'Operation not supported' && echo no-acl-ok
            { getfattr -n security.selinux f 2>&1 || true; } | grep -q 'Operation not supported' && echo no-label-ok
            { setfattr -n security.selinux -v x f 2>&1 || true; } | grep -q 'Operation not supported' && echo no-label-set-ok
            """)
        expectOK(r, "xattrs")
        #expect(r.out == "blue\n2\nyes\nnodata-ok\nremove-nodata-ok\nenotsup-ok\nno-acl-ok\nno-label-ok\nno-label-set-ok\n")
    }

    /// `ls -l` asks every file for its POSIX ACL and its security label (coreutils). ubiq keeps
    /// neither and says so (EOPNOTSUPP, as ext4 mounted `noacl` does for an ACL), and `ls` asks
    /// no more on that mount: two round trips to the daemon a file fewer for `ls -lR`
    /// (docs/performance.md). Counted by the daemon itself (`UBIQ_OP_STATS`).
    @Test func lsAsksOnceForWhatTheMountDoesNotKeep() throws {
        let m = try MountFixture(daemonEnv: ["UBIQ_OP_STATS": "1"])
        defer { m.cleanup() }
        expectOK(m.sh("mkdir a b && for i in $(seq 100); do echo $i > a/f$i; echo $i > b/g$i; done"))
        // Counted from a mount of its own: each write asks for `security.capability` (the kernel's own).
        expectOK(m.unmount())
        try m.mount()
        expectOK(m.sh("ls -lR . > /dev/null"))
        expectOK(m.unmount())
        let calls = try #require(Self.getxattrCalls(m))
        #expect(calls <= 10, "\(calls) getxattr calls for ls -lR of 200 files")
    }

    /// The kernel asks a file system for `security.capability` before a write, to drop it, until
    /// it knows the file has none (S_NOSEC), which it keeps only when the file system clears
    /// setuid/setgid itself (FUSE_HANDLE_KILLPRIV_V2, negotiated past libfuse 3.14: cubiqfuse.h).
    /// 2,000 writes to one file, then one write to each of 50: about one question a file, not
    /// one a write. (That they are cleared as on ext4: `permissionsFollowTheLocalDiskRules`.)
    @Test func writesDoNotAskForTheCapabilityEachTime() throws {
        let m = try MountFixture(daemonEnv: ["UBIQ_OP_STATS": "1"])
        defer { m.cleanup() }
        // Through the page cache (read-write handles): once a file. New files opened only for
        // writing skip the page cache, and the kernel asks nothing before their writes.
        expectOK(m.sh("""
            python3 -c '
            import os
            fd = os.open("big", os.O_RDWR | os.O_CREAT, 0o644)
            for i in range(2000): os.write(fd, b"x" * 4096)
            os.close(fd)
            for i in range(50): open(f"f{i}", "w+b").write(b"y")
            for i in range(300): open(f"new{i}", "wb").write(b"z")'
            """))
        expectOK(m.unmount())
        let calls = try #require(Self.getxattrCalls(m))
        #expect(calls <= 60, "\(calls) getxattr calls for 2,050 writes to 51 read-write files and 300 new write-only ones")
    }

    /// The daemon's count of `getxattr` calls in its last "operation times" line (0: no call;
    /// nil: no such line).
    static func getxattrCalls(_ m: MountFixture) -> Int? {
        let log = readWhole(m.state + "/ubiq.log")
        // "operation times: …; getxattr 4 calls, 12.3 us avg; …" (absent: no call at all)
        guard let line = log.split(separator: "\n").last(where: { $0.contains("operation times:") }) else { return nil }
        return line.split(separator: ";").first { $0.contains("getxattr ") }
            .flatMap { Int($0.split(separator: " ").drop { $0 != "getxattr" }.dropFirst().first ?? "") } ?? 0
    }

    @Test func renameFlagsOpenUnlinkedFilesAndSpecialNodes() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let r = m.sh("""
            echo A > a && echo B > b
            python3 - <<'EOF'
            import ctypes, os, errno
            libc = ctypes.CDLL(None, use_errno=True)
            AT = -100
            def renameat2(a, b, flags):
                r = libc.renameat2(AT, a.encode(), AT, b.encode(), flags)
                return 0 if r == 0 else ctypes.get_errno()
            print("noreplace", errno.errorcode.get(renameat2("a", "b", 1), "ok"))
            print("exchange", renameat2("a", "b", 2) or "ok", open("a").read().strip(), open("b").read().strip())
            print("exchange-missing", errno.errorcode.get(renameat2("a", "nope", 2), "ok"))
            # open, unlink, keep using
            fd = os.open("tmpfile", os.O_RDWR | os.O_CREAT, 0o600)
            os.write(fd, b"still here")
            os.unlink("tmpfile")
            os.lseek(fd, 0, 0)
            print("unlinked", os.read(fd, 100).decode(), os.path.exists("tmpfile"))
            os.close(fd)
            os.mkfifo("fifo")
            os.mknod("chardev", 0o600 | 0o020000, os.makedev(1, 3))
            st = os.lstat("chardev")
            print("chardev", oct(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev))
            try:
                os.rename("a", "a/x")
            except OSError as e:
                print("rename-into-file", errno.errorcode[e.errno])
            EOF
            """)
        expectOK(r, "python checks")
        #expect(r.out.contains("noreplace EEXIST"))
        #expect(r.out.contains("exchange ok B A"))
        #expect(r.out.contains("exchange-missing ENOENT"))
        #expect(r.out.contains("unlinked still here False"))
        #expect(r.out.contains("chardev 0o20600 1 3"))
        #expect(r.out.contains("rename-into-file ENOTDIR"))
    }

    @Test func ownersAreTheCallers() throws {
        // Other users reach the mount only with allow_other; permissions are then the kernel's to enforce.
        let m = try MountFixture(extra: "-o allow_other")
        defer { m.cleanup() }
        let r = m.sh("""
            chmod 777 .
            setpriv --reuid=1234 --regid=2345 --clear-groups sh -c 'echo x > mine && mkdir mydir && ln -s mine mylink'
            stat -c '%n %u %g' mine mydir
            chown 42:43 mine && stat -c '%u %g' mine
            { setpriv --reuid=1234 --regid=2345 --clear-groups sh -c 'chown 1:1 mydir' 2>&1 || true; } | grep -q 'Operation not permitted' && echo eperm-ok
            """)
        expectOK(r)
        #expect(r.out.contains("mine 1234 2345"))
        #expect(r.out.contains("mydir 1234 2345"))
        #expect(r.out.contains("42 43"))
        #expect(r.out.contains("eperm-ok"))
    }

    /// The same fallocate modes on the mount and on the local disk give the same bytes and sizes.
    @Test func fallocateModesMatchTheLocalDisk() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        let local = m.base + "/local"
        expectOK(shell("mkdir -p \(local) && head -c 65536 /dev/urandom > \(local)/seed"))
        // The modes FUSE passes on (collapse and insert range stop in the kernel with EOPNOTSUPP).
        let script = """
            set -e
            cp \(local)/seed f
            fallocate -l 131072 f
            fallocate -n -o 200000 -l 4096 f
            fallocate -p -o 4096 -l 8192 f
            fallocate -z -o 16384 -l 4096 f
            fallocate -z -o 120000 -l 20000 f
            stat -c %s f
            """
        let ref = shell(script, cwd: local)
        expectOK(ref, "on the local disk")
        let got = m.sh(script)
        expectOK(got, "on the mount")
        #expect(got.out == ref.out)
        expectOK(m.sh("cmp f \(local)/f"), "bytes after every mode")
    }
}
