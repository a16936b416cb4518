#!/usr/bin/env python3
"""Random POSIX operations applied to two trees — a ubiq mount and a plain
local directory — comparing every result (value or errno) and, every few
steps, the whole tree: names, types, modes, sizes, link counts, bytes,
symlink targets and user xattrs (not ubiq's own status, user.ubiq.*).

    fsrandom.py MOUNT_DIR LOCAL_DIR --seed N --ops N

Exit status 0 when both trees behaved alike; otherwise prints the seed, the
step and the operation that differed (replay with the same seed).
"""
import argparse
import errno
import hashlib
import os
import random
import stat
import sys

NAMES = ["a", "b", "c", "d", "e"]


def result(fn):
    try:
        r = fn()
        return ("ok", r)
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno, str(e.errno)))


def snapshot(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            item = {"type": stat.S_IFMT(st.st_mode), "mode": stat.S_IMODE(st.st_mode), "nlink": st.st_nlink}
            if stat.S_ISREG(st.st_mode):
                item["size"] = st.st_size
                with open(p, "rb") as f:
                    item["sha"] = hashlib.sha256(f.read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                item["target"] = os.readlink(p)
            if not stat.S_ISLNK(st.st_mode):
                item["xattrs"] = sorted((n, os.getxattr(p, n)) for n in os.listxattr(p)
                                         if n.startswith("user.") and not n.startswith("user.ubiq."))
            out[rel] = item
    return out


class Exerciser:
    def __init__(self, roots, rng):
        self.roots = roots
        self.rng = rng
        self.fds = []  # (fd per root)
        self.counts = {}

    def path(self):
        """Mostly something that exists (or a new name inside an existing folder), sometimes anything."""
        local = self.roots[1]
        existing = []
        dirs = [""]
        for dirpath, dirnames, filenames in os.walk(local):
            rel = os.path.relpath(dirpath, local)
            rel = "" if rel == "." else rel
            existing += [os.path.join(rel, n) for n in dirnames + filenames]
            dirs += [os.path.join(rel, n) for n in dirnames]
        roll = self.rng.random()
        if roll < 0.5 and existing:
            return self.rng.choice(sorted(existing))
        if roll < 0.9:
            return os.path.join(self.rng.choice(sorted(dirs)), self.rng.choice(NAMES))
        depth = self.rng.choice([1, 2, 3])
        return os.path.join(*[self.rng.choice(NAMES) for _ in range(depth)])

    def both(self, label, fn):
        rs = [result(lambda r=r: fn(r)) for r in self.roots]
        self.counts[rs[1][0]] = self.counts.get(rs[1][0], 0) + 1
        if rs[0] != rs[1]:
            return f"{label}: mount {rs[0]} vs local {rs[1]}"
        return None

    def step(self):
        r = self.rng
        p, q = self.path(), self.path()
        data = bytes(r.getrandbits(8) for _ in range(r.choice([0, 1, 100, 5000])))
        off = r.choice([0, 0, 10, 4096, 70000])
        size = r.choice([0, 1, 50, 4096, 100000])
        mode = r.choice([0o600, 0o644, 0o755, 0o700])
        op = r.choice(["create", "write", "write", "truncate", "read", "mkdir", "rmdir", "unlink",
                       "rename", "rename", "link", "symlink", "chmod", "setxattr", "rmxattr", "stat",
                       "listdir", "openwrite", "fdwrite", "fdclose"])
        j = lambda root, x: os.path.join(root, x)
        if op == "create":
            return self.both(f"create {p}", lambda root: os.close(os.open(j(root, p), os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)))
        if op == "write":
            def w(root):
                fd = os.open(j(root, p), os.O_WRONLY)
                try:
                    return os.pwrite(fd, data, off)
                finally:
                    os.close(fd)
            return self.both(f"write {p} @{off} {len(data)}", w)
        if op == "truncate":
            return self.both(f"truncate {p} {size}", lambda root: os.truncate(j(root, p), size))
        if op == "read":
            def rd(root):
                with open(j(root, p), "rb") as f:
                    return hashlib.sha256(f.read()).hexdigest()
            return self.both(f"read {p}", rd)
        if op == "mkdir":
            return self.both(f"mkdir {p}", lambda root: os.mkdir(j(root, p), mode))
        if op == "rmdir":
            return self.both(f"rmdir {p}", lambda root: os.rmdir(j(root, p)))
        if op == "unlink":
            return self.both(f"unlink {p}", lambda root: os.unlink(j(root, p)))
        if op == "rename":
            return self.both(f"rename {p} {q}", lambda root: os.rename(j(root, p), j(root, q)))
        if op == "link":
            return self.both(f"link {p} {q}", lambda root: os.link(j(root, p), j(root, q), follow_symlinks=False))
        if op == "symlink":
            return self.both(f"symlink {q} {p}", lambda root: os.symlink(q, j(root, p)))
        if op == "chmod":
            return self.both(f"chmod {p} {oct(mode)}", lambda root: os.chmod(j(root, p), mode, follow_symlinks=False)
                             if not os.path.islink(j(root, p)) else None)
        if op == "setxattr":
            name = "user." + r.choice(["x", "y"])
            return self.both(f"setxattr {p} {name}", lambda root: os.setxattr(j(root, p), name, data[:100], follow_symlinks=False)
                             if not os.path.islink(j(root, p)) else None)
        if op == "rmxattr":
            name = "user." + r.choice(["x", "y"])
            return self.both(f"removexattr {p} {name}", lambda root: os.removexattr(j(root, p), name, follow_symlinks=False)
                             if not os.path.islink(j(root, p)) else None)
        if op == "stat":
            def st(root):
                s = os.lstat(j(root, p))
                return (stat.S_IFMT(s.st_mode), stat.S_IMODE(s.st_mode), s.st_nlink,
                        s.st_size if not stat.S_ISDIR(s.st_mode) else None)
            return self.both(f"stat {p}", st)
        if op == "listdir":
            return self.both(f"listdir {p}", lambda root: sorted(os.listdir(j(root, p))))
        if op == "openwrite" and len(self.fds) < 4:
            fds = []
            for root in self.roots:
                fds.append(result(lambda root=root: os.open(j(root, p), os.O_RDWR)))
            if fds[0][0] != fds[1][0] or (fds[0][0] == "err" and fds[0] != fds[1]):
                for kind, fd in fds:
                    if kind == "ok":
                        os.close(fd)
                return f"open {p}: mount {fds[0]} vs local {fds[1]}"
            if fds[0][0] == "ok":
                self.fds.append((fds[0][1], fds[1][1]))
            return None
        if op == "fdwrite" and self.fds:
            pair = r.choice(self.fds)
            rs = [result(lambda fd=fd: os.pwrite(fd, data, off)) for fd in pair]
            return None if rs[0] == rs[1] else f"pwrite on open fd @{off}: {rs[0]} vs {rs[1]}"
        if op == "fdclose" and self.fds:
            pair = self.fds.pop(r.randrange(len(self.fds)))
            for fd in pair:
                os.close(fd)
            return None
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mount")
    ap.add_argument("local")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--check-every", type=int, default=25)
    ap.add_argument("--compare-only", action="store_true", help="only compare the two trees")
    ap.add_argument("--ignore-nlink", action="store_true",
                    help="another device sees hard links as separate files")
    ap.add_argument("--ignore-dir-meta", action="store_true",
                    help="folders' modes and xattrs are not compared (a store that keeps none for folders)")
    args = ap.parse_args()
    if args.compare_only:
        a, b = snapshot(args.mount), snapshot(args.local)
        for t in (a, b):
            for v in t.values():
                if args.ignore_nlink and v["type"] != stat.S_IFDIR:
                    v.pop("nlink")
                if args.ignore_dir_meta and v["type"] == stat.S_IFDIR:
                    v.pop("mode")
                    v.pop("xattrs", None)
        if a != b:
            bad = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)][:5]
            print(f"trees differ at {bad}: {[a.get(k) for k in bad]} vs {[b.get(k) for k in bad]}")
            return 1
        print(f"trees equal ({len(a)} items)")
        return 0
    rng = random.Random(args.seed)
    ex = Exerciser([args.mount, args.local], rng)
    for i in range(1, args.ops + 1):
        diff = ex.step()
        if diff:
            print(f"seed {args.seed} step {i}: {diff}")
            return 1
        if i % args.check_every == 0 or i == args.ops:
            a, b = snapshot(args.mount), snapshot(args.local)
            if a != b:
                keys = sorted(set(a) | set(b))
                bad = [k for k in keys if a.get(k) != b.get(k)][:5]
                print(f"seed {args.seed} step {i}: trees differ at {bad}: mount {[a.get(k) for k in bad]} local {[b.get(k) for k in bad]}")
                return 1
    for pair in ex.fds:
        for fd in pair:
            os.close(fd)
    print(f"seed {args.seed}: {args.ops} operations compared ({ex.counts.get('ok', 0)} succeeded, "
          f"{ex.counts.get('err', 0)} failed alike), trees equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
