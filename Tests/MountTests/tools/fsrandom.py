#!/usr/bin/env python3
"""Random POSIX operations applied to two trees — a ubiq mount and a plain
local directory — comparing every result (value or errno) and, every few
steps, the whole tree: names, types, modes, sizes, link counts, bytes,
symlink targets and user xattrs (not ubiq's own status, user.ubiq.*).

    fsrandom.py MOUNT_DIR LOCAL_DIR --seed N --ops N

Exit status 0 when both trees behaved alike; otherwise prints the seed, the
step and the operation that differed (replay with the same seed), then shrinks
the failing sequence: operations are taken out while the trees still differ
(both emptied before each try), and the shortest sequence found is printed as
JSON lines, replayable with --replay FILE.
"""
import argparse
import errno
import hashlib
import json
import os
import random
import shutil
import stat
import sys
import time

NAMES = ["a", "b", "c", "d", "e"]


def result(fn):
    try:
        r = fn()
        return ("ok", r)
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno, str(e.errno)))


def snapshot(root, unread=()):
    """Every item's type, mode, links, size, content digest, link target and user xattrs
    (`unread`: relative paths whose content is not read, only their size)."""
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
                if rel in unread:
                    out[rel] = item
                    continue
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
    def __init__(self, roots, rng, break_first=False):
        self.roots = roots
        self.rng = rng
        self.fds = []  # (fd per root)
        self.counts = {}
        # Only to test the shrinker: chmod on the first tree drops the owner's execute bit.
        self.break_first = break_first

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

    def generate(self):
        """The next operation, drawn at random, with its paths and bytes resolved."""
        r = self.rng
        p, q = self.path(), self.path()
        data = bytes(r.getrandbits(8) for _ in range(r.choice([0, 1, 100, 5000])))
        off = r.choice([0, 0, 10, 4096, 70000])
        size = r.choice([0, 1, 50, 4096, 100000])
        mode = r.choice([0o600, 0o644, 0o755, 0o700])
        op = r.choice(["create", "write", "write", "truncate", "read", "mkdir", "rmdir", "unlink",
                       "rename", "rename", "link", "symlink", "chmod", "setxattr", "rmxattr", "stat",
                       "listdir", "openwrite", "fdwrite", "fdclose"])
        o = {"op": op, "p": p, "q": q, "data": data.hex(), "off": off, "size": size, "mode": mode}
        if op in ("setxattr", "rmxattr"):
            o["name"] = "user." + r.choice(["x", "y"])
        if op in ("fdwrite", "fdclose"):
            o["slot"] = r.randrange(4)
        return o

    def step(self):
        return self.execute(self.generate())

    def close_all(self):
        for pair in self.fds:
            for fd in pair:
                os.close(fd)
        self.fds = []

    def execute(self, o):
        """Applies operation `o` to both trees; what differed, or None."""
        op, p, q, off, size, mode = o["op"], o["p"], o["q"], o["off"], o["size"], o["mode"]
        data = bytes.fromhex(o["data"])
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
            def ch(root):
                if os.path.islink(j(root, p)):
                    return None
                bad = self.break_first and root == self.roots[0]
                return os.chmod(j(root, p), mode & ~0o100 if bad else mode, follow_symlinks=False)
            return self.both(f"chmod {p} {oct(mode)}", ch)
        if op == "setxattr":
            name = o["name"]
            return self.both(f"setxattr {p} {name}", lambda root: os.setxattr(j(root, p), name, data[:100], follow_symlinks=False)
                             if not os.path.islink(j(root, p)) else None)
        if op == "rmxattr":
            name = o["name"]
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
            pair = self.fds[o["slot"] % len(self.fds)]
            rs = [result(lambda fd=fd: os.pwrite(fd, data, off)) for fd in pair]
            return None if rs[0] == rs[1] else f"pwrite on open fd @{off}: {rs[0]} vs {rs[1]}"
        if op == "fdclose" and self.fds:
            pair = self.fds.pop(o["slot"] % len(self.fds))
            for fd in pair:
                os.close(fd)
            return None
        return None


def differ(a, b):
    """The first few paths where two snapshots differ, with what each has there."""
    keys = sorted(set(a) | set(b))
    bad = [k for k in keys if a.get(k) != b.get(k)][:5]
    return f"trees differ at {bad}: mount {[a.get(k) for k in bad]} local {[b.get(k) for k in bad]}" if bad else None


def empty(root):
    for name in os.listdir(root):
        p = os.path.join(root, name)
        if os.path.isdir(p) and not os.path.islink(p):
            for dirpath, dirnames, _ in os.walk(p):
                os.chmod(dirpath, 0o700)
            shutil.rmtree(p)
        else:
            os.unlink(p)


def replay(ex, ops):
    """Both trees emptied, then `ops` applied: what differed (a step, or the trees at the end), or None."""
    ex.close_all()
    for root in ex.roots:
        empty(root)
    for o in ops:
        diff = ex.execute(o)
        if diff:
            return diff
    diff = differ(snapshot(ex.roots[0]), snapshot(ex.roots[1]))
    ex.close_all()
    return diff


def shrink(ex, ops, budget_s=60, budget_runs=400):
    """A shorter sequence that still makes the trees differ (delta debugging: chunks of
    operations taken out, halving the chunk size down to one operation)."""
    deadline, runs = time.time() + budget_s, 0
    if not replay(ex, ops):
        return None  # it does not happen again from empty trees (timing, or what came before)
    n = 2
    while len(ops) >= 2 and time.time() < deadline and runs < budget_runs:
        chunk = max(1, len(ops) // n)
        shrunk = False
        for start in range(0, len(ops), chunk):
            candidate = ops[:start] + ops[start + chunk:]
            runs += 1
            if candidate and replay(ex, candidate):
                ops, n, shrunk = candidate, max(n - 1, 2), True
                break
            if time.time() >= deadline or runs >= budget_runs:
                break
        if not shrunk:
            if chunk == 1:
                break
            n = min(len(ops), n * 2)
    return ops


def report_shrunk(ex, ops, args):
    if args.no_shrink:
        return
    shrunk = shrink(ex, ops)
    if shrunk is None:
        print("the difference did not happen again when replayed from empty trees: not shrunk")
        return
    print(f"shrunk to {len(shrunk)} operations (replay with --replay FILE, one JSON object a line):")
    for o in shrunk:
        print(json.dumps(o, sort_keys=True))
    print(f"which gives: {replay(ex, shrunk)}")


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
    ap.add_argument("--unread", action="append", default=[],
                    help="with --compare-only: a path whose content is not read (compared by size; checked elsewhere)")
    ap.add_argument("--replay", help="apply the operations in this file (JSON lines) to emptied trees")
    ap.add_argument("--no-shrink", action="store_true", help="do not shrink a failing sequence")
    ap.add_argument("--break-first-root", action="store_true",
                    help="make chmod wrong on the first tree (to test the shrinker)")
    args = ap.parse_args()
    if args.compare_only:
        a, b = snapshot(args.mount, args.unread), snapshot(args.local, args.unread)
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
    ex = Exerciser([args.mount, args.local], rng, break_first=args.break_first_root)
    if args.replay:
        with open(args.replay) as f:
            ops = [json.loads(line) for line in f if line.strip()]
        diff = replay(ex, ops)
        print(f"replayed {len(ops)} operations: {diff or 'trees equal'}")
        return 1 if diff else 0
    ops = []
    for i in range(1, args.ops + 1):
        o = ex.generate()
        ops.append(o)
        diff = ex.execute(o)
        if not diff and (i % args.check_every == 0 or i == args.ops):
            diff = differ(snapshot(args.mount), snapshot(args.local))
        if diff:
            print(f"seed {args.seed} step {i}: {diff}")
            report_shrunk(ex, ops, args)
            return 1
    ex.close_all()
    print(f"seed {args.seed}: {args.ops} operations compared ({ex.counts.get('ok', 0)} succeeded, "
          f"{ex.counts.get('err', 0)} failed alike), trees equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
