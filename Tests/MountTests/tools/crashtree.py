#!/usr/bin/env python3
"""A crash workload over a tree whose names are reused, and the check that follows the crash.

    crashtree.py run    DIR JOURNAL --seed N    # works in DIR until an operation fails
    crashtree.py verify DIR JOURNAL             # DIR holds everything the journal acknowledged

`run` works in a tree two folders deep whose names come from a pool of six, so that a name is
vacated and taken again all the time, by a file where a folder was and the other way round:
files written and closed (some fsynced), appends, folders made and removed, files and folders
renamed (onto free names, a file over a file, a folder over an empty folder), files deleted.
It does not sync folders: an operation is acknowledged when its call returned (the daemon may be
killed, the kernel is not). Before each operation it notes in JOURNAL (a file outside the
mount, fsynced) what it is about to do; once the operation returned, that it is done.

`verify` replays the journal: every operation marked done must show in DIR (each file byte for
byte, each folder there, nothing else); the paths under the one operation begun and not done
may hold either state, and what is there now is noted in the journal so that the next round
starts from it. Exit status 0 when DIR is as the journal says.
"""
import argparse
import json
import os
import random
import sys
import time

NAMES = [f"n{i}" for i in range(6)]
DEPTH = 3  # a path has at most this many parts
DIR = "dir"


from crashload import Journal, matches, sha  # noqa: E402 (beside this file: its journal, check and digest)


def under(path, prefix):
    return path == prefix or path.startswith(prefix + "/")


def apply(tree, op):
    """`tree` ({relative path: sha or DIR}) after the operation `op`."""
    kind, paths = op["op"], op["paths"]
    if kind in ("put", "append"):
        tree[paths[0]] = op["sha"]
    elif kind == "mkdir":
        tree[paths[0]] = DIR
    elif kind in ("delete", "rmdir"):
        tree.pop(paths[0], None)
    elif kind == "rename":
        a, b = paths
        for p in [p for p in tree if under(p, b)]:
            del tree[p]  # what the rename replaced (a file, an empty folder)
        for p in [p for p in tree if under(p, a)]:
            tree[b + p[len(a):]] = tree.pop(p)


def read_journal(path):
    """The acknowledged tree, and the path prefixes left uncertain by an op begun, not done."""
    tree, uncertain, begun = {}, [], None
    if not os.path.exists(path):
        return tree, uncertain
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break
            e = json.loads(line)
            if e["e"] == "begin":
                begun, uncertain = e, list(e["paths"])
            elif e["e"] == "done":
                apply(tree, begun)
                begun, uncertain = None, []
            elif e["e"] == "observed":
                # After a crash: what is under the uncertain prefixes now.
                for prefix in e["prefixes"]:
                    for p in [p for p in tree if under(p, prefix)]:
                        del tree[p]
                tree.update(e["found"])
                begun, uncertain = None, []
    return tree, uncertain


def scan(root):
    out = {}
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        for name in dirs:
            out[os.path.normpath(os.path.join(rel, name))] = DIR
        for name in files:
            p = os.path.join(d, name)
            with open(p, "rb") as f:
                out[os.path.normpath(os.path.join(rel, name))] = sha(f.read())
    return out


def folders(tree):
    return [""] + sorted(p for p, v in tree.items() if v == DIR)


def run(root, journal_path, seed, limit=None, pace=0.0):
    rng = random.Random(seed)
    j = Journal(journal_path)
    os.makedirs(root, exist_ok=True)
    tree, _ = read_journal(journal_path)
    ops = 0

    def child(parent):
        name = rng.choice(NAMES)
        return name if parent == "" else parent + "/" + name

    def full(p):
        return os.path.join(root, p)

    try:
        while limit is None or ops < limit:
            kind = rng.choices(["put", "append", "mkdir", "rename", "delete", "rmdir"],
                               [30, 12, 15, 25, 10, 8])[0]
            parent = rng.choice(folders(tree))
            if parent.count("/") + 1 >= DEPTH and kind in ("put", "mkdir"):
                parent = parent.rsplit("/", 1)[0]
            path = child(parent)
            have = tree.get(path)
            if kind == "put" and have != DIR:
                data = rng.randbytes(rng.choice([0, rng.randint(1, 2000), rng.randint(2000, 200_000)]))
                j.note(e="begin", op="put", paths=[path], sha=sha(data))
                # Over a file it has, without O_CREAT: a file that went meanwhile (the sync
                # removed it) fails the operation rather than come back unnoticed.
                flags = os.O_WRONLY | os.O_TRUNC | (0 if have else os.O_CREAT | os.O_EXCL)
                with os.fdopen(os.open(full(path), flags, 0o644), "wb") as f:
                    f.write(data)
                    if rng.random() < 0.2:
                        f.flush()
                        os.fsync(f.fileno())
            elif kind == "append" and have not in (None, DIR):
                with open(full(path), "rb") as f:
                    old = f.read()
                more = rng.randbytes(rng.randint(1, 5000))
                j.note(e="begin", op="append", paths=[path], sha=sha(old + more))
                with open(full(path), "ab") as f:
                    f.write(more)
            elif kind == "mkdir" and have is None:
                j.note(e="begin", op="mkdir", paths=[path])
                os.mkdir(full(path))
            elif kind == "delete" and have not in (None, DIR):
                j.note(e="begin", op="delete", paths=[path])
                os.unlink(full(path))
            elif kind == "rmdir" and have == DIR and not any(under(p, path) and p != path for p in tree):
                j.note(e="begin", op="rmdir", paths=[path])
                os.rmdir(full(path))
            elif kind == "rename" and have is not None:
                to = child(rng.choice(folders(tree)))
                there = tree.get(to)
                depth = max(p.count("/") - path.count("/") for p in tree if under(p, path))
                if under(to, path) or to.count("/") + depth + 1 > DEPTH:
                    continue
                if there is not None:
                    if (there == DIR) != (have == DIR):
                        continue
                    if there == DIR and any(under(p, to) and p != to for p in tree):
                        continue  # rename(2) replaces only an empty folder
                j.note(e="begin", op="rename", paths=[path, to])
                os.rename(full(path), full(to))
            else:
                continue
            op = {"op": kind, "paths": [path] if kind != "rename" else [path, to]}
            if kind in ("put", "append"):
                op["sha"] = sha(data) if kind == "put" else sha(old + more)
            apply(tree, op)
            j.note(e="done")
            ops += 1
            if pace:
                time.sleep(rng.uniform(0, pace))
    except OSError as e:
        print(f"stopped after {ops} operations: {e}")
    return 0


def verify(root, journal_path, quiet=False):
    tree, uncertain = read_journal(journal_path)
    have = scan(root)
    if not matches(journal_path, tree, have, lambda p: any(under(p, u) for u in uncertain),
                   lambda paths, names: any(under(n, p) or under(p, n) for p in paths for n in names), most=8):
        return 1
    if not quiet:
        found = {p: v for p, v in have.items() if any(under(p, u) for u in uncertain)}
        Journal(journal_path).note(e="observed", prefixes=uncertain, found=found)
    files = sum(1 for v in tree.values() if v != DIR)
    print(f"{files} acknowledged files and {len(tree) - files} folders intact ({len(uncertain)} uncertain paths)")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "verify", "check"])
    ap.add_argument("dir")
    ap.add_argument("journal")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ops", type=int, default=None, help="stop after this many (default: until one fails)")
    ap.add_argument("--pace", type=float, default=0.0, help="seconds, at most, between operations (random)")
    a = ap.parse_args()
    if a.mode == "run":
        sys.exit(run(a.dir, a.journal, a.seed, a.ops, a.pace))
    # check: as verify, but notes nothing (another device's view of the same journal)
    sys.exit(verify(a.dir, a.journal, quiet=a.mode == "check"))


if __name__ == "__main__":
    main()
