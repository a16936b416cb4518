"""`scripts/bench --scale N`: what following a bucket of N objects costs, counted at the server.

A counting proxy on loopback stands between the mounts and SeaweedFS and counts every request
by kind (LIST, GET, HEAD, PUT, POST, DELETE): the figures are the server's, not ubiq's own
claims. The bucket is filled by `rclone copy` (objects another tool wrote); a ubiq device (the
writer) mounts it straight from the server and writes the bucket's first snapshot; then, each on
a fresh device through the proxy:

- ubiq as it is (the bucket's change log at every poll, a full listing every 300 s);
- ubiq with a full listing at every poll (`--full-listing-interval` = `--poll-interval`): the
  feed before the change log;
- rclone mount (`--vfs-cache-mode full`), which does not look for changes unless asked.

For each: mount time and requests, `ls -lR` time and requests, requests per idle poll (over
`idle` seconds), RSS after mount and after `ls -lR`, and the time from a write on another ubiq
device to this one seeing it. Each ubiq device then mounts again (a reboot): until the mount
answers, and until its first poll is over; ubiq (the change log) also once more after the writer
added a folder of a tenth of the bucket (at most 10,000 files) while it was away.

Then a folder of a tenth of the bucket (at most 10,000 files), downloaded on a fresh ubiq
device, is renamed on the writer: the time until the device shows it under its new name, the
requests that cost it, and the bytes of files it downloaded again (none, when a move is a move).
"""
import http.client
import http.server
import json
import os
import subprocess
import threading
import time
import urllib.parse


class CountingProxy:
    """Forwards every request to `upstream` (host:port) as it came (the Host header too, so
    signatures stay valid) and counts them by kind."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.lock = threading.Lock()
        self.counts = {}
        self.file_bytes = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def forward(self):
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query, keep_blank_values=True)
                kind = self.command
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                if self.command == "GET" and ("list-type" in query or path.count("/") <= 1):
                    kind = "LIST"
                elif self.command == "GET" and "/.ubiquity/" not in path:
                    kind = "GET file"  # a download (a file's bytes, not the log's or a snapshot's)
                proxy.count(kind)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(proxy.upstream, timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "proxy-connection", "expect")}
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                if kind == "GET file":
                    with proxy.lock:
                        proxy.file_bytes += len(data)
                self.send_response_only(r.status, r.reason)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # A HEAD's length is the object's, not of the (empty) body read here.
                length = r.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length if length is not None else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, kind):
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def take(self):
        """The counts since the last call (and starts again)."""
        with self.lock:
            c, self.counts = self.counts, {}
            self.file_bytes = 0
        return c

    def stop(self):
        self.server.shutdown()


def total(c):
    return sum(c.values())


def shown(c):
    return ", ".join(f"{k} {v:,}" for k, v in sorted(c.items())) or "none"


def rss_mib(pid, field="VmRSS"):
    """A process's resident memory now (VmHWM: at its peak so far), in MiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def mount_pid(mnt):
    """The pid of the process serving the FUSE mount at `mnt` (ubiq's daemon, rclone)."""
    out = subprocess.run(["pgrep", "-f", mnt], capture_output=True, text=True).stdout.split()
    pids = [int(p) for p in out if int(p) != os.getpid()]
    return max(pids) if pids else None


def run(s3, binary, objects, idle=30.0, poll=3.0, only=("ubiq", "ubiq-listing", "rclone")):
    """`s3`: the bench's S3Bench (SeaweedFS started). Returns the figures by target (`only`:
    those of these; at a million objects rclone's `ls -lR` alone takes most of an hour)."""
    sh = lambda cmd: subprocess.run(cmd, shell=True, check=True, env=s3.env, stdout=subprocess.DEVNULL)
    upstream = urllib.parse.urlsplit(s3.endpoint).netloc
    proxy = CountingProxy(upstream)
    via = f"http://127.0.0.1:{proxy.port}"
    tree = os.path.join(s3.base, "scale-tree")
    per_dir = 1000
    # The folder renamed at the end, then folders of 1,000.
    renamed = min(10_000, objects // 10)
    os.makedirs(f"{tree}/folder", exist_ok=True)
    for i in range(renamed):
        with open(f"{tree}/folder/f{i:05d}", "wb") as f:
            f.write(b"r" * 64)
    rest = objects - renamed
    for d in range((rest + per_dir - 1) // per_dir):
        os.makedirs(f"{tree}/d{d:04d}", exist_ok=True)
        for i in range(min(per_dir, rest - d * per_dir)):
            with open(f"{tree}/d{d:04d}/f{i:04d}", "wb") as f:
                f.write(b"s" * 64)
    s3.curl("-X PUT", "/scale")
    t0 = time.perf_counter()
    sh(f"rclone copy --transfers 64 --checkers 64 --config /dev/null {tree} sw:scale/bench")
    fill_s = time.perf_counter() - t0
    # A snapshot leaves out objects changed within 2 s of its listing (S3 times are in seconds:
    # one may change again unseen); a bucket filled a moment ago is a bench's, not a user's.
    time.sleep(3)
    results = {"objects": objects, "fill_s": fill_s, "idle_s": idle, "poll_s": poll}
    # The writer: another ubiq device, straight to the server (its requests are not counted).
    writer = os.path.join(s3.base, "scale-writer", "mnt")
    os.makedirs(writer, exist_ok=True)
    # Its first full listing finds no snapshot of the bucket, asks for each object's metadata
    # (HEAD) and writes one: the fresh devices below start from it.
    t0 = time.perf_counter()
    sh(f"{binary} mount --store s3://scale/bench --s3-endpoint {s3.endpoint} --upload-delay 0 "
       f"--poll-interval 3600 --state {s3.base}/scale-writer/state {writer}")
    results["writer_mount_s"] = time.perf_counter() - t0
    size = subprocess.run(["rclone", "size", "--json", "--config", "/dev/null", "sw:scale/bench/.ubiquity/s3/snapshot"],
                          env=s3.env, capture_output=True, text=True)
    results["snapshot_bytes"] = json.loads(size.stdout).get("bytes") if size.returncode == 0 else None
    targets = [("ubiq", f"--poll-interval {poll:g}"),
               ("ubiq-listing", f"--poll-interval {poll:g} --full-listing-interval {poll:g}"),
               ("rclone", None)]
    targets = [t for t in targets if t[0] in only]
    try:
        for name, extra in targets:
            r = results[name] = {}
            mnt = os.path.join(s3.base, f"scale-{name}", "mnt")
            os.makedirs(mnt, exist_ok=True)
            proxy.take()
            t0 = time.perf_counter()
            if extra is not None:
                sh(f"{binary} mount --store s3://scale/bench --s3-endpoint {via} {extra} "
                   f"--state {s3.base}/scale-{name}/state {mnt}")
            else:
                env = dict(s3.env, RCLONE_CONFIG_SW_ENDPOINT=via)
                subprocess.Popen(["rclone", "mount", "sw:scale/bench", mnt, "--vfs-cache-mode", "full",
                                  "--cache-dir", f"{s3.base}/scale-{name}/cache", "--config", "/dev/null"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                deadline = time.time() + 60
                while not os.path.ismount(mnt) and time.time() < deadline:
                    time.sleep(0.05)
            r["mount_s"] = time.perf_counter() - t0
            r["mount_requests"] = proxy.take()
            if extra is not None:
                # A bucket of more than 100,000 objects: the rest comes in after the mount answers
                # (docs/sync.md), and ubiq sync waits for it.
                sh(f"{binary} sync {mnt}")
                r["mount_synced_s"] = time.perf_counter() - t0
                r["mount_sync_requests"] = proxy.take()
            pid = mount_pid(mnt)
            r["rss_mount_mib"] = rss_mib(pid)
            r["peak_mount_mib"] = rss_mib(pid, "VmHWM")
            t0 = time.perf_counter()
            sh(f"ls -lR {mnt} > /dev/null")
            r["ls_lR_s"] = time.perf_counter() - t0
            r["ls_lR_requests"] = proxy.take()
            r["rss_ls_mib"] = rss_mib(pid)
            time.sleep(poll + 1)  # what the mount and ls set going is over
            proxy.take()
            time.sleep(idle)
            c = proxy.take()
            r["idle_requests"] = c
            r["requests_per_poll"] = total(c) / (idle / poll)
            # A change on the writer (written and sent with ubiq sync), until this mount shows it.
            name_new = f"new-{name}.txt"
            t0 = time.perf_counter()
            sh(f"echo hello > {writer}/{name_new} && {binary} sync {writer}")
            r["writer_sync_s"] = time.perf_counter() - t0
            seen = None
            while time.perf_counter() - t0 < 60:
                if os.path.exists(os.path.join(mnt, name_new)):
                    seen = time.perf_counter() - t0
                    break
                time.sleep(0.05)
            r["change_seen_s"] = seen
            if extra is not None:
                subprocess.run([binary, "unmount", "--timeout", "120", mnt], env=s3.env, stdout=subprocess.DEVNULL)
                # The same device mounted again (a reboot): until the mount answers, then until
                # its first poll, which lists the bucket, is over (ubiq sync waits for it).
                proxy.take()
                t0 = time.perf_counter()
                sh(f"{binary} mount --store s3://scale/bench --s3-endpoint {via} {extra} "
                   f"--state {s3.base}/scale-{name}/state {mnt}")
                r["again_s"] = time.perf_counter() - t0
                r["again_requests"] = proxy.take()
                sh(f"{binary} sync {mnt}")
                r["again_synced_s"] = time.perf_counter() - t0
                r["again_sync_requests"] = proxy.take()
                subprocess.run([binary, "unmount", "--timeout", "120", mnt], env=s3.env, stdout=subprocess.DEVNULL)
                if name == "ubiq":
                    again_after_additions(r, s3, binary, proxy, via, writer, mnt, extra, objects, name)
            else:
                subprocess.run(["fusermount3", "-u", mnt])
        results["renamed_files"] = renamed
        results["rename"] = rename_seen(s3, binary, proxy, via, writer, renamed)
    finally:
        subprocess.run([binary, "unmount", "--timeout", "120", writer], env=s3.env, stdout=subprocess.DEVNULL)
        for name, _ in targets:
            mnt = os.path.join(s3.base, f"scale-{name}", "mnt")
            if os.path.ismount(mnt):
                subprocess.run(["fusermount3", "-u", "-z", mnt])
        proxy.stop()
    return results


def again_after_additions(r, s3, binary, proxy, via, writer, mnt, extra, objects, name):
    """While the device is away, the writer adds a folder of files (a tenth of the bucket, at
    most 10,000; through its mount, sent with ubiq sync); then the device mounts again: until
    the mount answers, and until ubiq sync (its first poll: the listing and the log) is over."""
    sh = lambda cmd: subprocess.run(cmd, shell=True, check=True, env=s3.env, stdout=subprocess.DEVNULL)
    added = min(10_000, max(1, objects // 10))
    folder = f"added-{name}"
    os.makedirs(f"{writer}/{folder}")
    for i in range(added):
        with open(f"{writer}/{folder}/f{i:05d}", "wb") as f:
            f.write(b"a" * 64)
    sh(f"{binary} sync {writer}")
    time.sleep(3)  # settled, as above: a device away for more than a moment
    proxy.take()
    t0 = time.perf_counter()
    sh(f"{binary} mount --store s3://scale/bench --s3-endpoint {via} {extra} --state {s3.base}/scale-{name}/state {mnt}")
    r["added"] = added
    r["added_again_s"] = time.perf_counter() - t0
    sh(f"{binary} sync {mnt}")
    r["added_synced_s"] = time.perf_counter() - t0
    r["added_requests"] = proxy.take()
    r["added_here"] = len(os.listdir(f"{mnt}/{folder}")) if os.path.isdir(f"{mnt}/{folder}") else 0
    subprocess.run([binary, "unmount", "--timeout", "120", mnt], env=s3.env, stdout=subprocess.DEVNULL)


def rename_seen(s3, binary, proxy, via, writer, files):
    """A fresh ubiq device downloads `folder`; the writer renames it (mv, then ubiq sync); the
    figures of the device seeing it. Rclone is left out: it does not look for changes (above)."""
    sh = lambda cmd: subprocess.run(cmd, shell=True, check=True, env=s3.env, stdout=subprocess.DEVNULL)
    mnt = os.path.join(s3.base, "scale-rename", "mnt")
    os.makedirs(mnt, exist_ok=True)
    r = {}
    try:
        # A fresh device after the writer wrote files through ubiq since its snapshot (the added
        # folder above; the writer's next full listing, which would write a snapshot of them, is
        # an hour away): what it asks for them.
        proxy.take()
        t0 = time.perf_counter()
        sh(f"{binary} mount --store s3://scale/bench --s3-endpoint {via} --poll-interval 3 "
           f"--state {s3.base}/scale-rename/state {mnt}")
        sh(f"{binary} sync {mnt}")  # past 100,000 objects, the rest comes in after the mount answers
        r["fresh_s"] = time.perf_counter() - t0
        r["fresh_requests"] = proxy.take()
        sh(f"cat {mnt}/folder/* > /dev/null")
        proxy.take()
        r["downloaded_before"] = sum(1 for e in os.scandir(f"{mnt}/folder") if e.stat().st_blocks > 0)
        t0 = time.perf_counter()
        sh(f"mv {writer}/folder {writer}/renamed && {binary} sync {writer}")
        r["writer_s"] = time.perf_counter() - t0
        seen = None
        while time.perf_counter() - t0 < 600:
            gone = not os.path.exists(f"{mnt}/folder")
            if gone and os.path.isdir(f"{mnt}/renamed") and len(os.listdir(f"{mnt}/renamed")) == files:
                seen = time.perf_counter() - t0
                break
            time.sleep(0.1)
        r["seen_s"] = seen
        with proxy.lock:
            r["file_bytes"] = proxy.file_bytes
        r["requests"] = proxy.take()
        r["downloaded_after"] = sum(1 for e in os.scandir(f"{mnt}/renamed") if e.stat().st_blocks > 0) if seen else None
        # The next full listing: what the log told is not asked for again. (Once settled: an
        # object written less than 2 s before a listing may change again unseen, and gets a
        # HEAD; the mount's next full listing is minutes away.)
        time.sleep(3)
        t1 = time.perf_counter()
        subprocess.run(f"{binary} sync --full {mnt}", shell=True, env=s3.env, stdout=subprocess.DEVNULL)
        r["full_after_s"] = time.perf_counter() - t1
        r["full_after_requests"] = proxy.take()
        log = f"{s3.base}/scale-rename/state/ubiq.log"
        if os.path.exists(log):
            text = open(log, errors="replace").read()
            r["moved_here"] = text.count("in the store: moved here")
    finally:
        subprocess.run([binary, "unmount", "--timeout", "120", mnt], env=s3.env, stdout=subprocess.DEVNULL)
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt])
    return r


def report(r):
    n = r["objects"]
    print()
    names = [k for k in ("ubiq", "ubiq-listing", "rclone") if k in r]
    heads = {"ubiq": "ubiq (change log)", "ubiq-listing": "ubiq (listing every poll)", "rclone": "rclone mount"}
    print(f"| a bucket of {n:,} objects, counted at the server | " + " | ".join(heads[k] for k in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    row = lambda label, f: print(f"| {label} | " + " | ".join(f(r[k]) for k in names) + " |")
    fmt = lambda v, d=2: "—" if v is None else f"{v:,.{d}f}"
    row("mount, fresh device (s)", lambda t: fmt(t["mount_s"]))
    row("requests during the mount", lambda t: f"{total(t['mount_requests']):,} ({shown(t['mount_requests'])})")
    row("fresh device, until everything is in (ubiq sync; s)", lambda t: fmt(t["mount_synced_s"]) if "mount_synced_s" in t else "—")
    row("requests from the mount's answer to that",
        lambda t: f"{total(t['mount_sync_requests']):,} ({shown(t['mount_sync_requests'])})" if "mount_synced_s" in t else "—")
    row("ls -lR after the mount (s)", lambda t: fmt(t["ls_lR_s"]))
    row("requests during ls -lR", lambda t: f"{total(t['ls_lR_requests']):,}")
    row(f"requests per {r['poll_s']:g} s (a poll's interval), idle",
        lambda t: f"{t['requests_per_poll']:,.1f} ({shown(t['idle_requests'])} in {r['idle_s']:g} s)")
    row("a file written on another device seen here, from the write (s)",
        lambda t: "not within 60 s" if t["change_seen_s"] is None else fmt(t["change_seen_s"]))
    row("of which the writer's ubiq sync (s)", lambda t: fmt(t["writer_sync_s"]))
    again = [k for k in names if "again_s" in r[k]]
    if again:
        row("mount again, the same device (s)", lambda t: fmt(t["again_s"]) if "again_s" in t else "—")
        row("requests during the mount again", lambda t: f"{total(t['again_requests']):,} ({shown(t['again_requests'])})" if "again_s" in t else "—")
        row("mount again, until its first poll is over (ubiq sync; s)", lambda t: fmt(t["again_synced_s"]) if "again_s" in t else "—")
        row("requests from the mount's answer to that", lambda t: f"{total(t['again_sync_requests']):,} ({shown(t['again_sync_requests'])})" if "again_s" in t else "—")
    if any("added_again_s" in r[k] for k in names):
        row("mount again after another device added files (s)",
            lambda t: f"{fmt(t['added_again_s'])} ({t['added']:,} files)" if "added_again_s" in t else "—")
        row("until its first poll is over (ubiq sync; s)", lambda t: fmt(t["added_synced_s"]) if "added_again_s" in t else "—")
        row("requests from the mount to that", lambda t: f"{total(t['added_requests']):,} ({shown(t['added_requests'])})" if "added_again_s" in t else "—")
        row("the new files there after it", lambda t: f"{t['added_here']:,}" if "added_again_s" in t else "—")
    row("RSS after mount (MiB)", lambda t: fmt(t["rss_mount_mib"], 0))
    row("RSS after ls -lR (MiB)", lambda t: fmt(t["rss_ls_mib"], 0))
    row("peak RSS during the mount (MiB)", lambda t: fmt(t["peak_mount_mib"], 0))
    print(f"\nFilled by rclone copy in {r['fill_s']:.0f} s (objects another tool wrote). The writer, a ubiq device straight to the")
    print(f"server, mounted first in {r['writer_mount_s']:.1f} s: a HEAD per object and a snapshot of the bucket written"
          + (f" ({r['snapshot_bytes'] / 1e6:.1f} MB)" if r.get("snapshot_bytes") else "")
          + ", which the fresh ubiq devices read instead of a HEAD each.")
    print("Every request goes through the counting proxy (Python, a connection to the server per request): times through")
    print("it are longer than straight to the server, most of all the mount's HEADs.")
    print("ubiq with a listing every poll: --full-listing-interval equal to --poll-interval; each of its polls also lists the log")
    print("twice (its state and its pruning), two requests the feed before the change log did not send.")
    print("rclone mount does not look for changes in the bucket unless a folder's listing has expired (--dir-cache-time, 5 min).")
    m = r.get("rename")
    if m:
        n = r["renamed_files"]
        added = r.get("ubiq", {}).get("added")
        if "fresh_s" in m:
            print(f"\nA fresh ubiq device mounted after the writer wrote files through ubiq since its snapshot"
                  + (f" ({added:,} and a few)" if added else "") + f": everything in after {m['fresh_s']:.1f} s, "
                  f"{total(m['fresh_requests']):,} requests ({shown(m['fresh_requests'])}).")
        print(f"\nA folder of {n:,} files, downloaded on a fresh ubiq device (change log, poll 3 s), renamed on the writer:")
        print(f"- the writer's mv and ubiq sync (a copy and a delete a file, straight to the server): {m['writer_s']:.1f} s")
        print("- seen whole on the device (the new name with every file, the old name gone), from the mv: "
              + ("not within 600 s" if m["seen_s"] is None else f"{m['seen_s']:.1f} s"))
        print(f"- requests meanwhile: {total(m['requests']):,} ({shown(m['requests'])}); bytes of files downloaded: {m['file_bytes']:,}")
        print(f"- moves applied as moves (the device's log): {m.get('moved_here', 0):,}")
        print(f"- files here in full: {m['downloaded_before']:,} before, "
              + ("—" if m["downloaded_after"] is None else f"{m['downloaded_after']:,}") + " after")
        if "full_after_s" in m:
            print(f"- the device's next full listing (ubiq sync --full): {m['full_after_s']:.1f} s, "
                  f"{total(m['full_after_requests']):,} requests ({shown(m['full_after_requests'])})")
