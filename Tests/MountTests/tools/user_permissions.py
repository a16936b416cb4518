#!/usr/bin/env python3
"""Permission rules on a user's own mount (no allow_other: only the mounting user enters),
compared with a local ext4 directory. Run as that user, with 1503 as a supplementary group:

    setpriv --reuid=65534 --regid=65534 --groups=1503 user_permissions.py MOUNT_DIR LOCAL_DIR

Each tree holds `others/`, made by root beforehand (on the mount: by another device, through
the store), owned by 1502:

    others/            1502:1502 0755
      f644 f600 f666   1502:1502, those modes
      g660             1502:65534 0660  (the user's own group)
      sup640           1502:1503 0640  (a supplementary group of the user)
      d711/inner       1502:1502 0711, 0644
      sup710/inner     1502:1503 0710 (search for a supplementary group only), 1502:1502 0644
      sticky/theirs    1502:1502 1777, 0666

Prints one line per check ("!!" where the two differ); exit status 1 if any differ.
"""
import errno
import os
import stat
import subprocess
import sys

ME, MYGROUP, OTHER, SUPPLEMENTARY = 65534, 65534, 1502, 1503


def attempt(fn):
    """'ok' (or what fn returned), else the errno name."""
    try:
        r = fn()
        return "ok" if r is None else str(r)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def opened(path, flags):
    def go():
        os.close(os.open(path, flags))
    return go


def write_file(path, data=b"x", mode=0o644):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def run_script(path):
    """Runs `path` (a shell script); its exit status, or the errno of the exec."""
    def go():
        return subprocess.run([path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    return go


def checks(root):
    os.chdir(root)
    out = []

    def check(label, fn):
        out.append((label, attempt(fn)))

    # Own files and folders.
    check("mkdir mine", lambda: os.mkdir("mine", 0o755))
    check("create mine/a", lambda: write_file("mine/a"))
    check("chmod mine/a 0444", lambda: os.chmod("mine/a", 0o444))
    check("open 0444 own for writing", opened("mine/a", os.O_WRONLY))
    check("open 0444 own for reading", opened("mine/a", os.O_RDONLY))
    check("open 0444 own with O_TRUNC", opened("mine/a", os.O_RDONLY | os.O_TRUNC))
    check("access W_OK 0444 own", lambda: os.access("mine/a", os.W_OK))
    check("access R_OK 0444 own", lambda: os.access("mine/a", os.R_OK))
    check("truncate 0444 own by path", lambda: os.truncate("mine/a", 0))
    check("utime explicit 0444 own", lambda: os.utime("mine/a", (1_000_000, 1_000_000)))
    check("utime now 0444 own", lambda: os.utime("mine/a"))
    check("setxattr 0444 own", lambda: os.setxattr("mine/a", "user.k", b"v"))
    check("chmod mine/a 0644", lambda: os.chmod("mine/a", 0o644))
    check("setxattr 0644 own", lambda: os.setxattr("mine/a", "user.k", b"v"))
    check("chmod mine/a 0000", lambda: os.chmod("mine/a", 0o000))
    check("open 0000 own for reading", opened("mine/a", os.O_RDONLY))
    check("getxattr 0000 own", lambda: os.getxattr("mine/a", "user.k").decode())
    check("listxattr 0000 own", lambda: ",".join(sorted(x for x in os.listxattr("mine/a") if x.startswith("user."))))
    check("stat 0000 own", lambda: oct(stat.S_IMODE(os.stat("mine/a").st_mode)))
    check("chmod 0000 own back to 0644", lambda: os.chmod("mine/a", 0o644))
    check("chown own to another user", lambda: os.chown("mine/a", OTHER, -1))
    check("chgrp own to a group not mine", lambda: os.chown("mine/a", -1, OTHER))
    check("chgrp own to a supplementary group", lambda: os.chown("mine/a", -1, SUPPLEMENTARY))
    check("chgrp own back to my group", lambda: os.chown("mine/a", -1, MYGROUP))
    check("chmod mine 0555", lambda: os.chmod("mine", 0o555))
    check("create in a 0555 own folder", lambda: write_file("mine/b"))
    check("mkdir in a 0555 own folder", lambda: os.mkdir("mine/sub"))
    check("unlink in a 0555 own folder", lambda: os.unlink("mine/a"))
    check("rename in a 0555 own folder", lambda: os.rename("mine/a", "mine/c"))
    check("symlink in a 0555 own folder", lambda: os.symlink("a", "mine/l"))
    check("link in a 0555 own folder", lambda: os.link("mine/a", "mine/h"))
    check("chmod mine 0311", lambda: os.chmod("mine", 0o311))
    check("list a 0311 own folder", lambda: len(os.listdir("mine")))
    check("stat in a 0311 own folder", lambda: os.stat("mine/a").st_size)
    check("chmod mine 0644", lambda: os.chmod("mine", 0o644))
    check("list a 0644 own folder", lambda: ",".join(sorted(os.listdir("mine"))))
    check("stat in a 0644 own folder", lambda: os.stat("mine/a").st_size)
    check("open in a 0644 own folder", opened("mine/a", os.O_RDONLY))
    check("chdir into a 0644 own folder", lambda: os.chdir("mine"))
    os.chdir(root)
    check("chmod mine 0755", lambda: os.chmod("mine", 0o755))
    check("symlink", lambda: os.symlink("a", "mine/l"))
    check("link", lambda: os.link("mine/a", "mine/h"))
    check("mkdir mine/d", lambda: os.mkdir("mine/d", 0o755))
    check("chmod mine/d 0555", lambda: os.chmod("mine/d", 0o555))
    check("rename a 0555 folder to another parent", lambda: os.rename("mine/d", "moved-d"))
    check("rename a 0555 folder in its parent", lambda: os.rename("mine/d", "mine/e"))
    check("script", lambda: write_file("mine/s.sh", b"#!/bin/sh\nexit 3\n"))
    check("exec 0644 own", run_script(os.path.join(root, "mine/s.sh")))
    check("chmod script 0744", lambda: os.chmod("mine/s.sh", 0o744))
    check("exec 0744 own", run_script(os.path.join(root, "mine/s.sh")))
    check("chmod script 0474", lambda: os.chmod("mine/s.sh", 0o474))
    check("exec 0474 own (x for the group only)", run_script(os.path.join(root, "mine/s.sh")))
    check("access X_OK 0474 own", lambda: os.access("mine/s.sh", os.X_OK))

    # Another user's, through the user's own group, a supplementary group, and as others.
    check("open 0644 of another for reading", opened("others/f644", os.O_RDONLY))
    check("open 0644 of another for writing", opened("others/f644", os.O_WRONLY))
    check("open 0600 of another for reading", opened("others/f600", os.O_RDONLY))
    check("open 0666 of another for writing", opened("others/f666", os.O_WRONLY))
    check("open 0660 of my group for writing", opened("others/g660", os.O_WRONLY))
    check("open 0640 of a supplementary group for reading", opened("others/sup640", os.O_RDONLY))
    check("open 0640 of a supplementary group for writing", opened("others/sup640", os.O_WRONLY))
    check("access R_OK 0640 of a supplementary group", lambda: os.access("others/sup640", os.R_OK))
    check("access W_OK 0644 of another", lambda: os.access("others/f644", os.W_OK))
    check("chmod 0666 of another", lambda: os.chmod("others/f666", 0o600))
    check("chown another's to me", lambda: os.chown("others/f666", ME, -1))
    check("utime explicit 0666 of another", lambda: os.utime("others/f666", (1_000_000, 1_000_000)))
    check("utime now 0666 of another", lambda: os.utime("others/f666"))
    check("utime now 0644 of another", lambda: os.utime("others/f644"))
    check("truncate 0666 of another by path", lambda: os.truncate("others/f666", 0))
    check("truncate 0644 of another by path", lambda: os.truncate("others/f644", 0))
    check("setxattr 0666 of another", lambda: os.setxattr("others/f666", "user.k", b"v"))
    check("setxattr 0644 of another", lambda: os.setxattr("others/f644", "user.k", b"v"))
    check("create in another's 0755 folder", lambda: write_file("others/new"))
    check("mkdir in another's 0755 folder", lambda: os.mkdir("others/newdir"))
    check("unlink in another's 0755 folder", lambda: os.unlink("others/f666"))
    check("rename out of another's 0755 folder", lambda: os.rename("others/f666", "mine/taken"))
    check("link into another's 0755 folder", lambda: os.link("mine/a", "others/a-link"))
    # With fs.protected_hardlinks (Debian's default), only to a file the user may read and write.
    check("link another's 0644 file", lambda: os.link("others/f644", "mine/f644-link"))
    check("link another's 0666 file", lambda: os.link("others/f666", "mine/f666-link"))
    check("list another's 0711 folder", lambda: len(os.listdir("others/d711")))
    check("stat in another's 0711 folder", lambda: os.stat("others/d711/inner").st_size)
    check("read in another's 0711 folder", opened("others/d711/inner", os.O_RDONLY))
    check("stat in a 0710 folder of a supplementary group", lambda: os.stat("others/sup710/inner").st_size)
    check("list a 0710 folder of a supplementary group", lambda: len(os.listdir("others/sup710")))
    check("create in another's sticky folder", lambda: write_file("others/sticky/mine"))
    check("unlink another's file in a sticky folder", lambda: os.unlink("others/sticky/theirs"))
    check("rename another's file in a sticky folder", lambda: os.rename("others/sticky/theirs", "others/sticky/t2"))
    check("write another's 0666 file in a sticky folder", opened("others/sticky/theirs", os.O_WRONLY))
    check("rename my file in a sticky folder", lambda: os.rename("others/sticky/mine", "others/sticky/mine2"))
    check("unlink my file in a sticky folder", lambda: os.unlink("others/sticky/mine2"))

    # What is left, by name, mode and owner.
    def tree():
        found = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for n in sorted(dirnames + filenames):
                p = os.path.join(dirpath, n)
                try:
                    s = os.lstat(p)
                    found.append(f"{os.path.relpath(p, root)} {oct(s.st_mode)} {s.st_uid}:{s.st_gid}")
                except OSError as e:
                    found.append(f"{os.path.relpath(p, root)} {errno.errorcode.get(e.errno)}")
        return found
    out.append(("what is left", " | ".join(tree())))
    return out


def main():
    mount, local = sys.argv[1], sys.argv[2]
    a, b = checks(mount), checks(local)
    differ = 0
    for (label, x), (_, y) in zip(a, b):
        if x == y:
            print(f"   {label}: {x}")
        else:
            differ += 1
            print(f"!! {label}: mount {x}, local disk {y}")
    print(f"{differ} of {len(a)} differ" if differ else f"all {len(a)} agree")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
