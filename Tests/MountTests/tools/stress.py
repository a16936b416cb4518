#!/usr/bin/env python3
"""Concurrency stress: many processes on a few shared files, and the check that follows.

    stress.py run   DIR --seconds S --workers N --seed X --tag T [--pace P] [--burst B] [--journal FILE]
    stress.py check DIR [--journal FILE ...]

`run` starts N processes that, for S seconds, replace files of a few shared names
atomically (write a temporary file, rename it over the name), read them back, append
fixed-size records to shared logs (O_APPEND), rename and delete, list the folder and read
ubiq's status attribute. Every file it writes checks itself:
  - a record: b"UBQ1", the body's length (8 bytes), its SHA-256 (32 bytes), the body;
  - a log (names ending in .log): 64-byte lines, each ending in a checksum of the rest; a
    line names its run's tag, its process and a sequence number, so it is one of a kind
    across the devices of a run.
`--pace P` waits 0–P s before each operation (a file then sits still now and then, and the
other device's version of it comes in between appends). `--burst B` works B seconds, then
rests B seconds, all processes of the run together, a run tagged B half a rest later than one
tagged A: a device at rest uploads what it wrote and takes the other's versions, and its next
burst appends to them (in bursts the devices take turns at the two logs). A read that finds a file torn, mixed or cut short fails the run at once (logs are read while
other processes append to them). `--journal` writes down every line whose append returned:
`check --journal` then finds each one in its log or in a conflict copy of it. Errors a shell
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


def log_line(tag, wid, seq):
    text = f"{tag}{wid:03d}:{seq:09d}:".ljust(55, "-")
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


def rest(burst, tag):
    """Sleeps through the rest of the run's cycle, if it is in one (`--burst`)."""
    if not burst:
        return
    cycle = 2 * burst
    at = (time.time() + (burst / 2 if tag == "B" else 0)) % cycle
    if at >= burst:
        time.sleep(cycle - at)


def log_to_append(rng, burst, tag):
    """Which log an append goes to: any, or in bursts the one this device's burst has (the
    devices take turns), so that the other log sits still here and the other device's
    versions of it replace it in place, to be appended to in this device's next burst."""
    if not burst:
        return rng.choice(LOGS)
    turn = int((time.time() + (burst / 2 if tag == "B" else 0)) // (2 * burst))
    return LOGS[(turn + (tag == "B")) % len(LOGS)]


def worker(root, wid, seed, seconds, tag, pace, burst, failures):
    rng = random.Random(seed * 1000 + wid)
    end = time.time() + seconds
    seq = 0
    ops = 0
    acked = []
    try:
        while time.time() < end:
            op = rng.choices(["replace", "read", "append", "readlog", "rename", "delete", "list", "status"],
                             [30, 20, 15, 10, 8, 5, 7, 5])[0]
            if pace:
                time.sleep(rng.uniform(0, pace))
            rest(burst, tag)
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
                    log = log_to_append(rng, burst, tag)
                    lines = [log_line(tag, wid, seq + k) for k in range(rng.randint(1, 20))]
                    seq += 20
                    fd = os.open(os.path.join(root, log), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    try:
                        data = b"".join(lines)
                        if os.write(fd, data) != len(data):
                            failures.put(f"worker {wid}: a short append to {log}")
                            return
                    finally:
                        os.close(fd)
                    acked += [f"{log} {line[:55].decode()}" for line in lines]
                elif op == "readlog":
                    log = rng.choice(LOGS)
                    why = check_file(os.path.join(root, log))
                    if why:
                        failures.put(f"worker {wid}: {log}: {why}")
                        return
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
    finally:
        failures.put(("acked", acked))
    failures.put(("ops", ops))


def run(root, seconds, workers, seed, tag, pace, burst, journal):
    os.makedirs(root, exist_ok=True)
    failures = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker, args=(root, w, seed, seconds, tag, pace, burst, failures)) for w in range(workers)]
    for p in procs:
        p.start()
    total, bad, acked, ended = 0, [], [], 0
    # Drained while the workers run: a process whose queue is not read does not end.
    while ended < workers:
        m = failures.get()
        if isinstance(m, tuple) and m[0] == "acked":
            acked += m[1]
            ended += 1
        elif isinstance(m, tuple):
            total += m[1]
        else:
            bad.append(m)
    for p in procs:
        p.join()
    while not failures.empty():
        m = failures.get()
        if isinstance(m, tuple) and m[0] == "ops":
            total += m[1]
        elif not isinstance(m, tuple):
            bad.append(m)
    if journal:
        with open(journal, "w") as f:
            f.write("".join(a + "\n" for a in acked))
    if bad:
        print("\n".join(bad))
        return 1
    print(f"{total} operations by {workers} processes, {len(acked)} log lines appended, every read whole")
    return 0


def check_journal(root, journals):
    """Every appended line is in its log, or in a conflict copy of its log."""
    found = {}
    for name in os.listdir(root):
        for log in LOGS:
            stem, ext = os.path.splitext(log)
            if name == log or (name.startswith(stem + " (conflict ") and name.endswith(ext)):
                data = open(os.path.join(root, name), "rb").read()
                found.setdefault(log, set()).update(data[i:i + 55].decode(errors="replace") for i in range(0, len(data), 64))
    lost = []
    for journal in journals:
        for entry in open(journal).read().splitlines():
            log, line = entry.split(" ", 1)
            if line not in found.get(log, set()):
                lost.append(f"{log}: {line.rstrip('-')}")
    return lost


def check(root, journals):
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
    lost = check_journal(root, journals)
    bad += [f"an acknowledged append is in no copy of its log: {x}" for x in lost[:20]]
    if lost:
        bad.append(f"{len(lost)} acknowledged lines lost")
    if bad:
        print("\n".join(bad))
        return 1
    total = sum(len(open(j).read().splitlines()) for j in journals)
    print(f"{n} files whole" + (f", all {total} acknowledged appends there" if journals else ""))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "check"])
    ap.add_argument("dir")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pace", type=float, default=0, help="wait 0-P s before each operation")
    ap.add_argument("--burst", type=float, default=0, help="work B s, rest B s (all processes together)")
    ap.add_argument("--tag", default="", help="a letter that sets this run's lines apart from another device's")
    ap.add_argument("--journal", action="append", default=[],
                    help="run: where to write the acknowledged appends; check: a run's journal (repeatable)")
    a = ap.parse_args()
    if a.mode == "run":
        sys.exit(run(a.dir, a.seconds, a.workers, a.seed, a.tag, a.pace, a.burst, a.journal[0] if a.journal else None))
    sys.exit(check(a.dir, a.journal))


if __name__ == "__main__":
    main()
