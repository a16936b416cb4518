#!/usr/bin/env python3
"""A write-heavy workload for crash tests, and the check that follows the crash.

    crashload.py run    DIR JOURNAL --seed N    # works in DIR until an operation fails
    crashload.py verify DIR JOURNAL             # DIR holds everything the journal acknowledged

`run` writes small and large files (close; fsync for the large ones), appends, renames and
deletes in DIR, syncing the folder after renames and deletes. Before each operation it notes
what it is about to do in JOURNAL (a file outside the mount, fsynced); once every call of the
operation returned, it notes that it is done. When the daemon behind DIR is killed, the
operation under way fails, and `run` stops.

`verify` replays the journal: every operation marked done is acknowledged, so its result
must be in DIR, byte for byte; the paths of the one operation begun and not done may hold
either state (or, for a write cut short, any bytes), and what is there now is noted in the
journal so that the next round starts from it. Exit status 0 when DIR is as the journal says.
"""
import argparse
import hashlib
import json
import os
import random
import sys

NAMES = [f"f{i}" for i in range(40)]


def sha(data):
    return hashlib.sha256(data).hexdigest()


class Journal:
    def __init__(self, path):
        self.f = open(path, "a")

    def note(self, **entry):
        self.f.write(json.dumps(entry) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())


def read_journal(path):
    """The acknowledged tree {name: sha} and the paths left uncertain by an op begun, not done."""
    tree, uncertain = {}, set()
    if not os.path.exists(path):
        return tree, uncertain
    begun = None
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # the journal's own last line, cut (the test's process is never killed, but)
            e = json.loads(line)
            kind = e["e"]
            if kind == "begin":
                begun = e
                uncertain = set(e["paths"])
            elif kind == "done":
                op = begun
                begun, uncertain = None, set()
                if op["op"] in ("put", "append"):
                    tree[op["paths"][0]] = op["sha"]
                elif op["op"] == "rename":
                    a, b = op["paths"]
                    tree[b] = tree.pop(a)
                elif op["op"] == "delete":
                    tree.pop(op["paths"][0], None)
            elif kind == "observed":
                # After a crash: what an uncertain path turned out to hold (sha, or null: absent).
                begun, uncertain = None, set()
                for p, h in e["paths"].items():
                    if h is None:
                        tree.pop(p, None)
                    else:
                        tree[p] = h
    return tree, uncertain


def scan(root):
    out = {}
    for name in os.listdir(root):
        with open(os.path.join(root, name), "rb") as f:
            out[name] = sha(f.read())
    return out


def run(root, journal_path, seed, limit=None):
    rng = random.Random(seed)
    j = Journal(journal_path)
    os.makedirs(root, exist_ok=True)
    tree, _ = read_journal(journal_path)
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    ops = 0
    try:
        while limit is None or ops < limit:
            kind = rng.choices(["put", "big", "append", "rename", "delete"], [40, 5, 20, 20, 15])[0]
            name = rng.choice(NAMES)
            path = os.path.join(root, name)
            if kind in ("put", "big"):
                size = rng.randint(0, 64 << 10) if kind == "put" else rng.randint(1 << 20, 6 << 20)
                data = rng.randbytes(size)
                j.note(e="begin", op="put", paths=[name], sha=sha(data))
                with open(path, "wb") as f:
                    f.write(data)
                    if kind == "big":
                        f.flush()
                        os.fsync(f.fileno())
                tree[name] = sha(data)
            elif kind == "append" and name in tree:
                with open(path, "rb") as f:
                    old = f.read()
                more = rng.randbytes(rng.randint(1, 20000))
                j.note(e="begin", op="append", paths=[name], sha=sha(old + more))
                with open(path, "ab") as f:
                    f.write(more)
                    f.flush()
                    os.fsync(f.fileno())
                tree[name] = sha(old + more)
            elif kind == "rename" and name in tree:
                to = rng.choice(NAMES)
                if to == name:
                    continue
                j.note(e="begin", op="rename", paths=[name, to])
                os.rename(path, os.path.join(root, to))
                os.fsync(dfd)
                tree[to] = tree.pop(name)
            elif kind == "delete" and name in tree:
                j.note(e="begin", op="delete", paths=[name])
                os.unlink(path)
                os.fsync(dfd)
                tree.pop(name)
            else:
                continue
            j.note(e="done")
            ops += 1
    except OSError as e:
        print(f"stopped after {ops} operations: {e}")
    return 0


def matches(journal_path, tree, have, skipped, touches, most=6):
    """Whether `have` (found) holds what `tree` (acknowledged) does, paths `skipped` aside; what
    differs is printed, with the journal lines whose paths `touches` one of them, last first."""
    bad = [f"{p}: acknowledged {tree.get(p)}, found {have.get(p)}"
           for p in sorted(set(tree) | set(have)) if not skipped(p) and tree.get(p) != have.get(p)]
    if not bad:
        return True
    print("lost or changed after the crash:\n  " + "\n  ".join(bad))
    names = {b.split(":")[0] for b in bad}
    with open(journal_path) as f:
        lines = f.readlines()
    shown = 0
    for i in range(len(lines) - 1, -1, -1):
        if touches(json.loads(lines[i]).get("paths", []), names):
            print(f"  journal line {i + 1} of {len(lines)}: {lines[i].strip()}")
            shown += 1
            if shown == most:
                break
    return False


def verify(root, journal_path):
    tree, uncertain = read_journal(journal_path)
    have = scan(root)
    if not matches(journal_path, tree, have, lambda p: p in uncertain, lambda paths, names: set(paths) & names):
        return 1
    Journal(journal_path).note(e="observed", paths={p: have.get(p) for p in uncertain})
    print(f"{len(tree)} acknowledged files intact ({len(uncertain)} uncertain paths)")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "verify"])
    ap.add_argument("dir")
    ap.add_argument("journal")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ops", type=int, default=None, help="stop after this many (default: until one fails)")
    a = ap.parse_args()
    sys.exit(run(a.dir, a.journal, a.seed, a.ops) if a.mode == "run" else verify(a.dir, a.journal))


if __name__ == "__main__":
    main()
