#!/usr/bin/python3
"""Ubiquity's Nautilus extension (desktop/nautilus), tested for real on a ubiq mount.

Puts items of the mount in each state (in the cloud, downloading, downloaded, kept on this
device, uploading, conflict, error), then:
1. checks the extension's own functions with Nautilus's real Python bindings (the status
   word, the emblem, the menu items as Nautilus.MenuItem, what each action does);
2. starts GNOME Files under Xvfb on the mount with the extension installed, waits until it has
   labelled every item, takes a screenshot (kept at OUT) and looks in it for each emblem;
3. changes an item behind Nautilus's back and checks that the extension heard it from
   `ubiq watch` and Nautilus asked about that item again.

  nautilus_check.py --mount M --store S --desktop DIR --ubiq BIN --out PNG
Exit status 0 when every check held; otherwise each failure on a line of its own.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAILED: " + what, flush=True)
    return ok


def wait(condition, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def status(path):
    try:
        return os.getxattr(path, "user.ubiq.status").decode()
    except OSError as e:
        return f"({e.strerror})"


class FakeFile:
    """What the extension asks of a Nautilus.FileInfo, for a path; records what it is told."""

    def __init__(self, path):
        from gi.repository import Gio
        self.location = Gio.File.new_for_path(path)
        self.emblems, self.attributes, self.invalidated = [], {}, 0

    def get_location(self):
        return self.location

    def add_emblem(self, name):
        self.emblems.append(name)

    def add_string_attribute(self, name, value):
        self.attributes[name] = value

    def invalidate_extension_info(self):
        self.invalidated += 1


def make_states(m, store, ubiq):
    """Items in each state; returns the reader that keeps big.bin downloading."""
    def write(name, data):
        with open(os.path.join(m, name), "wb") as f:
            f.write(data)
    damaged = b"damaged:" + os.urandom(24).hex().encode()
    for name, data in [("placeholder.txt", b"in the cloud\n"), ("downloaded.txt", b"here\n"),
                       ("pinned.txt", b"kept\n"), ("report.txt", b"report\n"), ("damaged.txt", damaged)]:
        write(name, data)
    os.mkdir(os.path.join(m, "Photos"))
    write("Photos/beach.jpg", b"\xff\xd8 not really a photo")
    with open(os.path.join(m, "big.bin"), "wb") as f:  # at 128 KiB/s: two minutes downloading
        for _ in range(16):
            f.write(os.urandom(1 << 20))
    names = ["placeholder.txt", "downloaded.txt", "pinned.txt", "report.txt", "damaged.txt", "big.bin", "Photos"]
    # Generous: a machine busy with other suites can take minutes over what takes a second here.
    uploaded = wait(lambda: all(status(os.path.join(m, n)) == "current" for n in names), 300)
    if not check(uploaded, "not everything was uploaded: " + ", ".join(f"{n}={status(os.path.join(m, n))}" for n in names)):
        return None
    for name in ["placeholder.txt", "damaged.txt", "big.bin"]:
        os.setxattr(os.path.join(m, name), "user.ubiq.action", b"evict")
    os.setxattr(os.path.join(m, "pinned.txt"), "user.ubiq.action", b"pin")
    open(os.path.join(m, "report (conflict laptop 2026-11-26 101500).txt"), "wb").close()
    # The store's copy of damaged.txt changed behind ubiq: its download fails its digest check.
    blobs = [os.path.join(d, f) for d, _, fs in os.walk(store) for f in fs]
    hit = [b for b in blobs if os.path.getsize(b) == len(damaged) and open(b, "rb").read() == damaged]
    check(len(hit) == 1, f"the store's copy of damaged.txt was not found ({len(hit)} candidates)")
    for b in hit:
        with open(b, "wb") as f:
            f.write(b"X" * len(damaged))
    r = subprocess.run(["cat", os.path.join(m, "damaged.txt")], capture_output=True)
    check(r.returncode != 0, "a download that fails its digest check was read")
    # Over the store's quota (32 MiB): refused, tried again, uploading all along.
    with open(os.path.join(m, "uploading.bin"), "wb") as f:
        for _ in range(24):
            f.write(os.urandom(1 << 20))
    reader = subprocess.Popen(["cat", os.path.join(m, "big.bin")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return reader


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--mount", required=True)
    a.add_argument("--store", required=True)
    a.add_argument("--desktop", required=True)
    a.add_argument("--ubiq", required=True)
    a.add_argument("--out", required=True)
    args = a.parse_args()
    m = args.mount
    os.environ["PATH"] = os.path.dirname(args.ubiq) + os.pathsep + os.environ.get("PATH", "")
    work = tempfile.mkdtemp(prefix="ubiq-nautilus-")
    log = os.path.join(work, "extension.log")
    os.environ["UBIQ_NAUTILUS_LOG"] = log
    reader = None
    children = []
    try:
        reader = make_states(m, args.store, args.ubiq)
        if reader is None:
            return
        expected = {"placeholder.txt": "placeholder", "downloaded.txt": "current", "pinned.txt": "pinned",
                    "report.txt": "conflict", "damaged.txt": "error", "big.bin": "downloading",
                    "uploading.bin": "uploading", "Photos": None,
                    "report (conflict laptop 2026-11-26 101500).txt": None}
        wait(lambda: status(os.path.join(m, "big.bin")) == "downloading", 60)

        # 1. The extension's own functions, with the real bindings.
        sys.path.insert(0, os.path.join(args.desktop, "nautilus"))
        import ubiq_nautilus as ext
        from gi.repository import Nautilus
        check(ext.mount_of(os.path.join(m, "report.txt")) == m, f"{m} is not seen as a ubiq mount")
        check(ext.mount_of(work) is None, "a folder outside the mount is seen as one")
        extension = ext.UbiqExtension()
        for name, word in expected.items():
            p = os.path.join(m, name)
            shown = ext.shown_status(p)
            if word is not None:
                check(shown == word, f"{name}: shown as {shown}, expected {word} (status {status(p)})")
            f = FakeFile(p)
            extension.update_file_info(f)
            check(f.emblems == [ext.SHOWN[shown][0]], f"{name}: emblems {f.emblems}")
            check(f.attributes.get("ubiq_status") == ext.SHOWN[shown][1], f"{name}: column {f.attributes}")
        # It remembers the latest items only (a huge tree does not pin every one in memory).
        small = ext.UbiqExtension()
        small.remembered = 2
        for name in ["placeholder.txt", "downloaded.txt", "pinned.txt"]:
            small.update_file_info(FakeFile(os.path.join(m, name)))
        check(list(small.files) == [os.path.join(m, "downloaded.txt"), os.path.join(m, "pinned.txt")],
              f"remembered: {list(small.files)}")
        for w in small.watchers.values():
            w.stop()
        outside = FakeFile(work)
        extension.update_file_info(outside)
        check(outside.emblems == [] and outside.attributes == {}, "a folder outside the mount got an emblem")
        check([c.get_property("label") for c in extension.get_columns()] == ["Sync status"], "no Sync status column")

        def labels(*names):
            items = extension.get_file_items([FakeFile(os.path.join(m, n)) for n in names])
            check(all(isinstance(i, Nautilus.MenuItem) for i in items), "menu items are not Nautilus.MenuItem")
            return [i.get_property("label") for i in items]
        check(labels("placeholder.txt") == ["Download now", "Always keep on this device"], f"placeholder menu: {labels('placeholder.txt')}")
        check(labels("downloaded.txt") == ["Free up space", "Always keep on this device"], f"downloaded menu: {labels('downloaded.txt')}")
        check(labels("pinned.txt") == ["Stop keeping on this device"], f"pinned menu: {labels('pinned.txt')}")
        check(labels("report.txt") == ["Free up space", "Always keep on this device", "Show versions"], f"conflict menu: {labels('report.txt')}")
        check("Download now" in labels("Photos"), f"folder menu: {labels('Photos')}")
        check(extension.get_file_items([FakeFile(work)]) == [], "a menu for a folder outside the mount")
        versions = ext.versions_text(os.path.join(m, "report.txt"))
        check("conflict" in versions.lower(), f"Show versions says: {versions!r}")
        # Not uploaded yet: freeing its space is refused, and the reason is shown.
        refused = ext.act([os.path.join(m, "uploading.bin")], "evict")
        check(len(refused) == 1, f"evicting a file not uploaded was not refused: {refused}")
        for w in extension.watchers.values():
            w.stop()

        # 2. GNOME Files, for real.
        share = os.path.join(work, "share")
        os.makedirs(os.path.join(share, "nautilus-python", "extensions"))
        shutil.copy(os.path.join(args.desktop, "nautilus", "ubiq_nautilus.py"), os.path.join(share, "nautilus-python", "extensions"))
        shutil.copytree(os.path.join(args.desktop, "icons"), os.path.join(share, "icons", "hicolor", "scalable", "emblems"))
        display = next(n for n in range(90, 200) if not os.path.exists(f"/tmp/.X11-unix/X{n}") and not os.path.exists(f"/tmp/.X{n}-lock"))
        xvfb = subprocess.Popen(["Xvfb", f":{display}", "-screen", "0", "1120x720x24", "-nolisten", "tcp"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        children.append(xvfb)
        check(wait(lambda: os.path.exists(f"/tmp/.X11-unix/X{display}"), 20), "Xvfb did not start")
        home = os.path.join(work, "home")
        os.makedirs(home)
        os.makedirs(os.path.join(work, "run"), mode=0o700)
        env = dict(os.environ, HOME=home, DISPLAY=f":{display}", XDG_DATA_DIRS=share + ":/usr/share",
                   XDG_RUNTIME_DIR=os.path.join(work, "run"), XDG_CONFIG_HOME=os.path.join(home, ".config"),
                   GSK_RENDERER="cairo", NO_AT_BRIDGE="1")
        script = ("gsettings set org.gnome.nautilus.preferences default-folder-viewer list-view && "
                  "gsettings set org.gnome.nautilus.list-view default-visible-columns "
                  "\"['name', 'size', 'UbiqNautilus::status', 'date_modified']\" && "
                  "gsettings set org.gnome.nautilus.window-state initial-size '(900, 640)' && "
                  f"exec nautilus --new-window '{m}'")
        nautilus = subprocess.Popen(["dbus-run-session", "--", "sh", "-c", script], env=env,
                                    stdout=open(os.path.join(work, "nautilus.out"), "wb"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
        children.append(nautilus)

        def labelled():
            try:
                lines = open(log, encoding="utf-8").read().splitlines()
            except OSError:
                return set()
            return {l.split(" ", 1)[1].rsplit(" ", 2)[0] for l in lines if l.startswith("item ")}
        open(log, "w").close()
        everything = {os.path.join(m, n) for n in expected}
        if not check(wait(lambda: everything <= labelled(), 180),
                     f"Nautilus did not label every item: missing {sorted(everything - labelled())}; "
                     f"its output: {open(os.path.join(work, 'nautilus.out'), errors='replace').read()[-2000:]}"):
            return
        from PIL import ImageGrab
        colours = {}
        for word in ["placeholder", "current", "pinned", "uploading", "conflict", "error"]:
            svg = open(os.path.join(args.desktop, "icons", ext.SHOWN[word][0] + ".svg")).read()
            colour = svg.split('fill="#', 1)[1][:6]
            colours[word] = tuple(int(colour[i:i + 2], 16) for i in (0, 2, 4))

        def missing(image):
            """The emblems not drawn in `image`: fewer than 30 pixels of their colour."""
            pixels = list(image.convert("RGB").getdata())
            return {w: n for w, rgb in colours.items()
                    if (n := sum(1 for p in pixels if all(abs(p[i] - rgb[i]) <= 3 for i in range(3)))) < 30}
        # Labelled is not yet drawn (a busy machine draws late): looked at until every emblem is there.
        deadline = time.time() + 120
        while True:
            shot = ImageGrab.grab(xdisplay=f":{display}")
            shot = shot.crop(shot.getbbox() or (0, 0) + shot.size)  # the window, not the black around it
            gone = missing(shot)
            if not gone or time.time() > deadline:
                break
            time.sleep(1)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        shot.save(args.out)
        print(f"screenshot: {args.out}", flush=True)
        check(not gone, f"emblems not in the screenshot (pixels of their colour): {gone}")

        # 3. Live: an item freed behind Nautilus's back is labelled again from `ubiq watch`.
        target = os.path.join(m, "downloaded.txt")
        before = open(log, encoding="utf-8").read().count(f"item {target} ")
        os.setxattr(target, "user.ubiq.action", b"evict")
        check(wait(lambda: f"item {target} placeholder" in open(log, encoding="utf-8").read(), 120),
              f"Nautilus did not show downloaded.txt as in the cloud after ubiq watch reported it; log:\n"
              + open(log, encoding="utf-8").read()[-3000:])
        check(open(log, encoding="utf-8").read().count(f"item {target} ") > before, "downloaded.txt was not labelled again")
        # And the menu's action, through the extension: download it again.
        check(ext.act([target], "download") == [], "Download now failed")
        check(wait(lambda: status(target) == "current", 120), f"Download now did not download: {status(target)}")
    finally:
        if reader is not None:
            reader.kill()
            reader.wait()
        for c in reversed(children):
            try:
                os.killpg(c.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            c.wait()
        if failures:  # what the extension and Nautilus said, for the failure's reader
            for name in ["extension.log", "nautilus.out"]:
                try:
                    print(f"--- {name} (end):\n" + open(os.path.join(work, name), errors="replace").read()[-4000:])
                except OSError:
                    pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - a check script: every failure is reported
        failures.append(f"{type(e).__name__}: {e}")
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        raise
    sys.exit(1 if failures else 0)
