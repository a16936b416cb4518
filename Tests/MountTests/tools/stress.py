#!/usr/bin/env python3
"""Concurrency stress: many processes on a few shared files, and the check that follows.

    stress.py run   DIR --seconds S --workers N --seed X --tag T
    stress.py check DIR

`run` starts N processes that, for S seconds, replace files of a few shared names
atomically (write a temporary file, rename it over the name), read them back, append
fixed-size records to shared logs (O_APPEND), rename and delete, list the folder and read
ubiq's status attribute. Every file it writes checks itself:
  - a record: b"UBQ1", the body's length (8 bytes), its SHA-256 (32 bytes), the body;
  - a log (names ending in .log): 64-byte lines, each ending in a checksum of the rest.
A read that finds a file torn, mixed or cut short fails the run at once. Errors a shell
tool would meet on a local disk too (ENOENT when another process renamed a name away) are
expected; any other errno fails the run.

`check` reads every file under DIR and verifies each one (conflict copies included).
Exit status 0 when all is whole.
"""
import argparse
import errno
import hashlib
import multiprocessing
import os
import random
import sys
import time

NAMES = [f"s{i}" for i in range(6)]
LOGS = ["a.log", "b.log"]
EXPECTED = {errno.ENOENT}


def record(rng):
    body = rng.randbytes(rng.choice([0, 10, 3000, 70000, 300000]))
    return b"UBQ1" + len(body).to_bytes(8, "big") + hashlib.sha256(body).digest() + body


def check_record(data):
    if len(data) < 44 or data[:4] != b"UBQ1":
        return f"not a whole record ({len(data)} bytes, starts {data[:8]!r})"
    n = int.from_bytes(data[4:12], "big")
    if len(data) != 44 + n:
        return f"record of {n} body bytes is {len(data)} bytes long"
    if hashlib.sha256(data[44:]).digest() != data[12:44]:
        return "record body does not match its digest (mixed or torn)"
    return None


def log_line(wid, seq):
    text = f"{wid:03d}:{seq:09d}:".ljust(55, "-")
    return (text + hashlib.sha1(text.encode()).hexdigest()[:8] + "\n").encode()


def check_log(data):
    if len(data) % 64:
        return f"log of {len(data)} bytes is not whole lines"
    for i in range(0, len(data), 64):
        line = data[i:i + 64]
        text = line[:55]
        if line[63:] != b"\n" or hashlib.sha1(text).hexdigest()[:8].encode() != line[55:63]:
            return f"log line {i // 64} is torn: {line!r}"
    return None


def check_file(path):
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path)
    if ".log" in name:
        return check_log(data)
    return check_record(data)


def worker(root, wid, seed, seconds, failures):
    rng = random.Random(seed * 1000 + wid)
    end = time.time() + seconds
    seq = 0
    ops = 0
    try:
        while time.time() < end:
            op = rng.choices(["replace", "read", "append", "rename", "delete", "list", "status"],
                             [30, 30, 15, 8, 5, 7, 5])[0]
            name = rng.choice(NAMES)
            path = os.path.join(root, name)
            try:
                if op == "replace":
                    tmp = os.path.join(root, f".tmp-{wid}-{seq}")
                    seq += 1
                    with open(tmp, "wb") as f:
                        f.write(record(rng))
                    os.rename(tmp, path)
                elif op == "read":
                    why = check_file(path)
                    if why:
                        failures.put(f"worker {wid}: {name}: {why}")
                        return
                elif op == "append":
                    log = os.path.join(root, rng.choice(LOGS))
                    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    try:
                        os.write(fd, b"".join(log_line(wid, seq + k) for k in range(rng.randint(1, 20))))
                    finally:
                        os.close(fd)
                    seq += 20
                elif op == "rename":
                    os.rename(path, os.path.join(root, rng.choice(NAMES)))
                elif op == "delete":
                    os.unlink(path)
                elif op == "list":
                    os.listdir(root)
                elif op == "status":
                    os.getxattr(path, "user.ubiq.status")
                ops += 1
            except OSError as e:
                if e.errno not in EXPECTED:
                    failures.put(f"worker {wid}: {op} {name}: {e}")
                    return
    except Exception as e:  # noqa: BLE001 - any surprise fails the run, with its story
        failures.put(f"worker {wid}: {e!r}")
        return
    failures.put(("ops", ops))


def run(root, seconds, workers, seed):
    os.makedirs(root, exist_ok=True)
    failures = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker, args=(root, w, seed, seconds, failures)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    total, bad = 0, []
    while not failures.empty():
        m = failures.get()
        if isinstance(m, tuple):
            total += m[1]
        else:
            bad.append(m)
    if bad:
        print("\n".join(bad))
        return 1
    print(f"{total} operations by {workers} processes, every read whole")
    return 0


def check(root):
    bad, n = [], 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.startswith(".tmp-"):
                why = check_record(open(os.path.join(dirpath, name), "rb").read())
            else:
                why = check_file(os.path.join(dirpath, name))
            n += 1
            if why:
                bad.append(f"{os.path.relpath(os.path.join(dirpath, name), root)}: {why}")
    if bad:
        print("\n".join(bad))
        return 1
    print(f"{n} files whole")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "check"])
    ap.add_argument("dir")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    sys.exit(run(a.dir, a.seconds, a.workers, a.seed) if a.mode == "run" else check(a.dir))


if __name__ == "__main__":
    main()
