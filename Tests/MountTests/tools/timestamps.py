#!/usr/bin/env python3
"""Which of mtime, ctime and atime change, on a file and on its folders, after each
operation: compared between a ubiq mount and a local ext4 directory.

    timestamps.py MOUNT_DIR LOCAL_DIR

Prints one line per operation ("!!" where the two differ); exit status 1 if any differ.
"""
import os, sys, time
def st(p): s = os.lstat(p); return (s.st_mtime_ns, s.st_ctime_ns, s.st_atime_ns)
def check(root):
    out = []
    os.chdir(root)
    def prep():
        for n in os.listdir("."):
            os.system(f"rm -rf '{n}'")
        os.mkdir("d"); os.mkdir("d2")
        with open("d/f", "w") as f: f.write("x")
        os.symlink("f", "d/s")
        time.sleep(0.02)
    ops = {
        "write": lambda: open("d/f", "a").write("y"),
        "truncate": lambda: os.truncate("d/f", 0),
        "truncate-same": lambda: os.truncate("d/f", 1),
        "chmod": lambda: os.chmod("d/f", 0o600),
        "chown-same": lambda: os.chown("d/f", os.getuid(), os.getgid()),
        "link": lambda: os.link("d/f", "d/g"),
        "unlink-one-of-two": lambda: (os.link("d/f", "d/g"), time.sleep(0.02), os.unlink("d/g")),
        "rename-file": lambda: os.rename("d/f", "d2/f"),
        "rename-dir": lambda: os.rename("d", "d2/d"),
        "setxattr": lambda: os.setxattr("d/f", "user.a", b"1"),
        "create-existing": lambda: os.close(os.open("d/f", os.O_CREAT | os.O_WRONLY)),
        "open-trunc": lambda: os.close(os.open("d/f", os.O_TRUNC | os.O_WRONLY)),
        "mkdir-in": lambda: os.mkdir("d/sub"),
        "utime-omit": lambda: os.utime("d/f", ns=(1, 2)),
        "read": lambda: open("d/f").read(),
    }
    for name, op in ops.items():
        prep()
        paths = ["d/f", "d", "d2"]
        before = {p: st(p) for p in paths}
        op()
        after = {}
        for p in paths:
            q = p
            if not os.path.lexists(q):
                q = {"d/f": "d2/f" if os.path.exists("d2/f") else "d2/d/f", "d": "d2/d"}.get(p, p)
            after[p] = st(q) if os.path.lexists(q) else None
        changes = []
        for p in paths:
            if after[p] is None: changes.append(f"{p}:gone"); continue
            b, a = before[p], after[p]
            changes.append(f"{p}:" + "".join(c for c, x, y in zip("mca", b, a) if x != y))
        out.append(f"{name:18} " + " ".join(changes))
    return out
a = check(sys.argv[1]); b = check(sys.argv[2])
for x, y in zip(a, b):
    print(("   " if x == y else "!! ") + x + ("" if x == y else f"   | ext4: {y[19:]}"))
sys.exit(0 if a == b else 1)
