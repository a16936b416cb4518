#!/usr/bin/env python3
"""Permission and ownership rules, run as root and as other users, compared
between a ubiq mount (mounted with allow_other) and a local ext4 directory.

    permissions.py MOUNT_DIR LOCAL_DIR

Prints one line per check ("!!" where the two differ); exit status 1 if any differ.
"""
import errno
import mmap
import os
import stat
import struct
import sys

U1, G1, U2, G2 = 1501, 1501, 1502, 1502


def as_user(uid, gid, fn):
    """Runs fn() in a child process with uid/gid; returns 'ok' or the errno name."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            fn()
            res = "ok"
        except OSError as e:
            res = errno.errorcode.get(e.errno, str(e.errno))
        os.write(w, res.encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return out


def fallocate(p):
    fd = os.open(p, os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, 8192)
    finally:
        os.close(fd)


def mode(p):
    return oct(stat.S_IMODE(os.lstat(p).st_mode))


def owner(p):
    s = os.lstat(p)
    return f"{s.st_uid}:{s.st_gid}"


def run(root):
    os.chdir(root)
    for n in os.listdir("."):
        os.system(f"rm -rf '{n}'")
    os.chmod(".", 0o777)
    out = []

    def rec(name, value):
        out.append(f"{name:40} {value}")

    open("f", "w").write("x")
    os.chown("f", U1, G1)
    rec("chmod by non-owner", as_user(U2, G2, lambda: os.chmod("f", 0o777)))
    rec("chmod by owner", as_user(U1, G1, lambda: os.chmod("f", 0o640)))
    rec("mode after", mode("f"))
    rec("chown by non-root", as_user(U1, G1, lambda: os.chown("f", U2, -1)))
    rec("chgrp to a group not ours", as_user(U1, G1, lambda: os.chown("f", -1, G2)))
    rec("utime explicit by non-owner", as_user(U2, G2, lambda: os.utime("f", (1, 1))))
    os.chmod("f", 0o666)
    rec("utime now by writer, non-owner", as_user(U2, G2, lambda: os.utime("f", None)))
    rec("utime explicit by writer, non-owner", as_user(U2, G2, lambda: os.utime("f", (5, 5))))
    os.chmod("f", 0o600)
    rec("read without permission", as_user(U2, G2, lambda: open("f").read()))
    rec("write without permission", as_user(U2, G2, lambda: open("f", "a").write("y")))
    # setuid/setgid cleared by a write of another user, and by chown.
    os.chmod("f", 0o6777)
    rec("write by other clears suid", as_user(U2, G2, lambda: open("f", "a").write("z")))
    rec("mode after other's write", mode("f"))
    os.chmod("f", 0o6755)
    os.chown("f", U2, G2)
    rec("mode after chown by root", mode("f"))
    # ... and each other way a file's content changes, by another user and by root (ubiq clears
    # them itself: FUSE_HANDLE_KILLPRIV_V2, docs/kernel-options.md).
    for name, change in [
        ("write", lambda: open("f", "a").write("z")),
        ("truncate", lambda: os.truncate("f", 1)),
        ("open O_TRUNC", lambda: os.close(os.open("f", os.O_WRONLY | os.O_TRUNC))),
        ("fallocate", lambda: fallocate("f")),
    ]:
        os.chown("f", U1, G1)
        os.chmod("f", 0o6777)
        rec(f"{name} by other", as_user(U2, G2, change) + " " + mode("f"))
        os.chmod("f", 0o6777)
        change()
        rec(f"{name} by root", mode("f"))
    os.chmod("f", 0o2666)  # setgid without group execute stays (mandatory locking's mark)
    rec("write by other, setgid without g+x", as_user(U2, G2, lambda: open("f", "a").write("z")) + " " + mode("f"))
    os.chmod("f", 0o2666)
    rec("write by group member, setgid without g+x", as_user(U1, G1, lambda: open("f", "a").write("z")) + " " + mode("f"))
    os.chown("f", U1, G1)
    os.chmod("f", 0o6755)
    rec("chgrp by owner", as_user(U1, G1, lambda: os.chown("f", -1, G1)) + " " + mode("f"))
    # A file capability goes with a write, whoever writes.
    cap = struct.pack("<IIIII", 0x02000000, 1 << 10, 0, 0, 0)  # VFS_CAP_REVISION_2, cap_net_bind_service
    os.chmod("f", 0o666)
    for who, write in [("other", lambda: as_user(U2, G2, lambda: open("f", "a").write("z"))),
                       ("root", lambda: open("f", "a").write("z"))]:
        os.setxattr("f", "security.capability", cap)
        write()
        rec(f"capability after {who}'s write", "kept" if "security.capability" in os.listxattr("f") else "gone")
    # A new file opened only for writing (on ubiq its writes skip the kernel's page cache:
    # docs/kernel-options.md): setuid/setgid and a capability go with its writes as on a local
    # disk, and a reader that holds its pages sees each write.
    def create_write_only(name, bits):
        old = os.umask(0)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, bits)
        finally:
            os.umask(old)
        os.write(fd, b"1")
        os.close(fd)
    rec("new write-only 6755 file, by other", as_user(U2, G2, lambda: create_write_only("wo-other", 0o6755)) + " " + mode("wo-other"))
    create_write_only("wo-root", 0o6755)
    rec("new write-only 6755 file, by root", mode("wo-root"))
    fd = os.open("wo-cap", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"1")
    os.setxattr("wo-cap", "security.capability", cap)
    os.write(fd, b"2")
    os.close(fd)
    rec("capability, new write-only file's write", "kept" if "security.capability" in os.listxattr("wo-cap") else "gone")
    fd = os.open("wo-read", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"a" * 100)
    r = os.open("wo-read", os.O_RDONLY)
    first = os.pread(r, 4096, 0)
    mapped = mmap.mmap(r, 100, mmap.MAP_SHARED, mmap.PROT_READ)
    os.pwrite(fd, b"b" * 50, 25)
    seen = mapped[20:30]
    os.write(fd, b"c" * 10)
    second = os.pread(r, 4096, 0)
    os.close(fd)
    again = open("wo-read", "rb").read()
    mapped.close()
    os.close(r)
    rec("reader of a new write-only file", f"{len(first)} {second.count(b'b')} {len(second)} {again == second} {seen}")
    # Sticky directory: only the owner of an entry (or of the folder) removes it.
    os.mkdir("sticky")
    os.chmod("sticky", 0o1777)  # mkdir(2) applies the umask
    as_user(U1, G1, lambda: open("sticky/mine", "w").write("1"))
    rec("unlink other's file in sticky dir", as_user(U2, G2, lambda: os.unlink("sticky/mine")))
    rec("rename other's file in sticky dir", as_user(U2, G2, lambda: os.rename("sticky/mine", "sticky/x")))
    rec("unlink own file in sticky dir", as_user(U1, G1, lambda: os.unlink("sticky/mine")))
    # setgid folders pass their group on; subfolders inherit the bit.
    os.mkdir("sg")
    os.chown("sg", 0, 4242)
    os.chmod("sg", 0o2777)  # mkdir(2) drops setgid from its mode argument
    as_user(U1, G1, lambda: open("sg/file", "w").write("1"))
    as_user(U1, G1, lambda: os.mkdir("sg/sub"))
    rec("group of file in setgid dir", owner("sg/file"))
    rec("group and mode of folder in setgid dir", owner("sg/sub") + " " + mode("sg/sub"))
    # Search permission on a folder.
    os.mkdir("closed")
    os.chmod("closed", 0o755)
    open("closed/inside", "w").write("1")
    rec("stat through a closed folder", as_user(U2, G2, lambda: os.stat("closed/inside")))
    rec("list a closed folder", as_user(U2, G2, lambda: os.listdir("closed")))
    os.chmod("closed", 0o700)
    rec("create in a read-only folder", as_user(U2, G2, lambda: open("closed/new", "w")))
    # New items belong to their creator.
    as_user(U1, G1, lambda: os.mkdir("u1dir"))
    as_user(U1, G1, lambda: os.symlink("target", "u1link"))
    rec("owner of new folder, symlink", owner("u1dir") + " " + owner("u1link"))
    rec("symlink mode", mode("u1link"))
    return out


a = run(sys.argv[1])
b = run(sys.argv[2])
for x, y in zip(a, b):
    print(("   " if x == y else "!! ") + x + ("" if x == y else f"   | ext4: {y[41:]}"))
sys.exit(0 if a == b else 1)
