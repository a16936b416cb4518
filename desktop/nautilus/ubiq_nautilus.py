"""Ubiquity in GNOME Files (Nautilus 43 and later, through nautilus-python 4).

What `getfattr -n user.ubiq.status` says of an item, the file manager shows: an emblem on each
item in a ubiq mount and a "Sync status" column in the list view. The context menu offers
Download now, Free up space, Always keep on this device (or Stop keeping), and for a conflict,
Show versions. Each acts as `setfattr -n user.ubiq.action` does (download, evict, pin, unpin)
or runs `ubiq versions`. Status follows changes as `ubiq watch` reports them, one watcher per
mount: no file is polled.

Installed by the ubiq package to /usr/share/nautilus-python/extensions/; restart Nautilus
(`nautilus -q`) to load it. UBIQ_NAUTILUS_LOG=FILE makes it write one line per item it
labels and per event it hears (what the tests read).
"""

import json
import os
import re
import shutil
import subprocess
import time
from typing import Dict, List, Optional

import gi

gi.require_version("Nautilus", "4.0")
from gi.repository import GLib, GObject, Gio, Nautilus  # noqa: E402

STATUS = "user.ubiq.status"
PINNED = "user.ubiq.pinned"
ACTION = "user.ubiq.action"

# What the file manager shows for each status word (docs/status.md), "pinned" being a current
# item kept on this device: the emblem's icon name (desktop/icons) and the column's text.
SHOWN = {
    "placeholder": ("emblem-ubiq-placeholder", "In the cloud"),
    "downloading": ("emblem-ubiq-downloading", "Downloading"),
    "current": ("emblem-ubiq-downloaded", "Downloaded"),
    "pinned": ("emblem-ubiq-pinned", "Always on this device"),
    "uploading": ("emblem-ubiq-uploading", "Uploading"),
    "conflict": ("emblem-ubiq-conflict", "Conflict"),
    "error": ("emblem-ubiq-error", "Error"),
    "local": ("emblem-ubiq-local", "On this device only"),
}


def log(line: str) -> None:
    target = os.environ.get("UBIQ_NAUTILUS_LOG")
    if not target:
        return
    with open(target, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def path_of(file) -> Optional[str]:
    location = file.get_location()
    return location.get_path() if location is not None else None


def ubiq_mounts() -> List[str]:
    """Mount points of ubiq mounts (fuse.ubiq in /proc/self/mountinfo), longest first."""
    found = []
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                left, _, right = line.partition(b" - ")
                if right.split(b" ", 1)[0] == b"fuse.ubiq":
                    # Spaces and other bytes in the mount point come as octal escapes (\040).
                    point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), left.split(b" ")[4])
                    found.append(os.fsdecode(point))
    except OSError:
        pass
    return sorted(found, key=len, reverse=True)


def mount_of(path: str, mounts: Optional[List[str]] = None) -> Optional[str]:
    """The ubiq mount `path` is in (`mounts`: as `ubiq_mounts` says, read once by a caller
    asking of many paths)."""
    for point in mounts if mounts is not None else ubiq_mounts():
        if path == point or path.startswith(point.rstrip("/") + "/"):
            return point
    return None


def attribute(path: str, name: str) -> Optional[str]:
    try:
        return os.getxattr(path, name).decode()
    except OSError:
        return None


def shown_status(path: str) -> Optional[str]:
    """The word the file manager shows for `path`: its status, with "pinned" for a current
    item kept on this device. None outside a ubiq mount (or when the mount does not answer)."""
    word = attribute(path, STATUS)
    if word is None:
        return None
    if word == "current" and attribute(path, PINNED) == "1":
        return "pinned"
    return word if word in SHOWN else "error"


def act(paths: List[str], action: str) -> List[str]:
    """Asks ubiq to `action` (download, evict, pin, unpin) each of `paths`, as
    `setfattr -n user.ubiq.action -v ACTION` does. Returns what failed, with the reason."""
    failed = []
    for p in paths:
        try:
            os.setxattr(p, ACTION, action.encode())
        except OSError as e:
            failed.append(f"{os.path.basename(p)}: {e.strerror}")
    log(f"action {action} {json.dumps(paths)} failed={json.dumps(failed)}")
    return failed


def versions_text(path: str) -> str:
    """What `ubiq versions PATH` says: the versions the store keeps, and the conflict copies."""
    ubiq = shutil.which("ubiq") or "ubiq"
    r = subprocess.run([ubiq, "versions", path], capture_output=True, text=True, timeout=60)
    return (r.stdout + r.stderr).strip()


def menu_plan(paths: List[str]) -> List[tuple]:
    """The menu items for `paths` (all in ubiq mounts): (name, label, action) tuples."""
    words = {p: shown_status(p) for p in paths}
    if not paths or any(w is None for w in words.values()):
        return []
    pinned = {p: attribute(p, PINNED) == "1" for p in paths}
    plan = []
    if any(w in ("placeholder", "error") or os.path.isdir(p) for p, w in words.items()):
        plan.append(("UbiqNautilus::download", "Download now", "download"))
    # A file kept on this device is never evicted: Stop keeping comes first (as in iCloud Drive).
    if any(w in ("current", "conflict") and not pinned[p] for p, w in words.items()):
        plan.append(("UbiqNautilus::evict", "Free up space", "evict"))
    if all(pinned.values()):
        plan.append(("UbiqNautilus::unpin", "Stop keeping on this device", "unpin"))
    else:
        plan.append(("UbiqNautilus::pin", "Always keep on this device", "pin"))
    if len(paths) == 1 and words[paths[0]] == "conflict":
        plan.append(("UbiqNautilus::versions", "Show versions", "versions"))
    return plan


class Watcher:
    """`ubiq watch MOUNT`, read line by line on the main loop; each event's paths go to
    `changed`."""

    def __init__(self, mount: str, changed):
        self.mount = mount
        self.changed = changed
        ubiq = shutil.which("ubiq") or "ubiq"
        self.process = Gio.Subprocess.new([ubiq, "watch", mount],
                                          Gio.SubprocessFlags.STDOUT_PIPE | Gio.SubprocessFlags.STDERR_SILENCE)
        self.lines = Gio.DataInputStream.new(self.process.get_stdout_pipe())
        self.alive = True
        log(f"watching {mount}")
        self.lines.read_line_async(GLib.PRIORITY_DEFAULT, None, self.line)

    def line(self, stream, result):
        try:
            text, _ = stream.read_line_finish_utf8(result)
        except GLib.Error:
            text = None
        if text is None:
            self.alive = False
            log(f"watch of {self.mount} ended")
            return
        try:
            event = json.loads(text)
        except ValueError:
            event = {}
        paths = [p for p in (event.get("path"), event.get("from")) if p]
        log(f"event {event.get('event')} {json.dumps(paths)}")
        self.changed(paths)
        self.lines.read_line_async(GLib.PRIORITY_DEFAULT, None, self.line)

    def stop(self):
        self.process.force_exit()


class UbiqExtension(GObject.GObject, Nautilus.InfoProvider, Nautilus.ColumnProvider, Nautilus.MenuProvider):
    def __init__(self):
        super().__init__()
        # The items the file manager asked about lately, by path (at most `remembered`, the
        # oldest forgotten first): an event about one asks the file manager about it again. One
        # not remembered is asked about when the file manager shows it next.
        self.files: Dict[str, object] = {}
        self.remembered = 20000
        self.watchers: Dict[str, Watcher] = {}

    # InfoProvider: an emblem and the column's text.
    def update_file_info(self, file) -> None:
        path = path_of(file)
        mount = mount_of(path) if path is not None else None
        if mount is None:
            return
        word = shown_status(path)
        if word is None:
            return
        emblem, text = SHOWN[word]
        file.add_emblem(emblem)
        file.add_string_attribute("ubiq_status", text)
        self.files.pop(path, None)
        self.files[path] = file
        if len(self.files) > self.remembered:
            del self.files[next(iter(self.files))]
        self.watch(mount)
        log(f"item {path} {word} {emblem}")

    def watch(self, mount: str) -> None:
        w = self.watchers.get(mount)
        if w is None or not w.alive:
            self.watchers[mount] = Watcher(mount, self.changed)

    def changed(self, paths: List[str]) -> None:
        """Asks the file manager again about each item an event names, and the folders above
        it (their status sums up what is under them)."""
        again = set()
        mounts = ubiq_mounts()
        for p in paths:
            mount = mount_of(p, mounts)
            while p and mount:
                again.add(p)
                if p == mount:
                    break
                p = os.path.dirname(p)
        for p in again:
            f = self.files.get(p)
            if f is not None:
                f.invalidate_extension_info()

    # ColumnProvider
    def get_columns(self):
        return [Nautilus.Column(name="UbiqNautilus::status", attribute="ubiq_status",
                                label="Sync status", description="Ubiquity's sync status of the item")]

    # MenuProvider
    def get_file_items(self, files):
        paths = [path_of(f) for f in files]
        mounts = ubiq_mounts()
        if not paths or any(p is None or mount_of(p, mounts) is None for p in paths):
            return []
        items = []
        for name, label, action in menu_plan(paths):
            item = Nautilus.MenuItem(name=name, label=label, tip="", icon="")
            item.connect("activate", self.activate, action, paths)
            items.append(item)
        return items

    def activate(self, _item, action: str, paths: List[str]) -> None:
        if action == "versions":
            show_text(f"Versions of {os.path.basename(paths[0])}", versions_text(paths[0]))
            return
        failed = act(paths, action)
        if failed:
            show_text("Ubiquity", "Not done:\n" + "\n".join(failed))
        self.changed(paths)


def show_text(title: str, text: str) -> None:
    """A small window with `text` (GTK 4, as Nautilus 43 runs)."""
    try:
        import gi
        gi.require_version("Gtk", "4.0")
        from gi.repository import Gtk
    except (ImportError, ValueError):
        log(f"window {title}: {text}")
        return
    window = Gtk.Window(title=title, default_width=560, default_height=320)
    label = Gtk.Label(label=text, selectable=True, wrap=True, xalign=0, yalign=0)
    scroller = Gtk.ScrolledWindow(child=label)
    window.set_child(scroller)
    window.present()
    log(f"window {title}: {text}")
