#!/usr/bin/env python3
"""File handles, as NFS and `open_by_handle_at(2)` use them (the caller needs
CAP_DAC_READ_SEARCH: root).

    handles.py get PATH...             prints each path's handle (TYPE:HEX), a line each
    handles.py open MOUNTPOINT HANDLE  prints the first 100 bytes of the file the handle
                                       names, or "error NAME" (ESTALE; EISDIR: a folder)
"""
import ctypes
import errno
import os
import sys

AT_FDCWD = -100
libc = ctypes.CDLL(None, use_errno=True)


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * 128)]


def get(path):
    fh = FileHandle(handle_bytes=128)
    mount_id = ctypes.c_int()
    if libc.name_to_handle_at(AT_FDCWD, path.encode(), ctypes.byref(fh), ctypes.byref(mount_id), 0) != 0:
        e = ctypes.get_errno()
        sys.exit(f"name_to_handle_at {path}: {os.strerror(e)}")
    return f"{fh.handle_type}:{bytes(fh.f_handle[:fh.handle_bytes]).hex()}"


def open_(mountpoint, handle):
    kind, hexed = handle.split(":")
    data = bytes.fromhex(hexed)
    fh = FileHandle(handle_bytes=len(data), handle_type=int(kind))
    ctypes.memmove(fh.f_handle, data, len(data))
    mfd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    fd = libc.open_by_handle_at(mfd, ctypes.byref(fh), os.O_RDONLY)
    e = ctypes.get_errno()
    os.close(mfd)
    if fd < 0:
        print("error", errno.errorcode.get(e, str(e)))
        return
    try:
        print(os.read(fd, 100).decode(errors="replace"), end="")
    except OSError as e:
        print("error", errno.errorcode.get(e.errno, str(e.errno)))
    finally:
        os.close(fd)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "get":
        for p in sys.argv[2:]:
            print(get(p))
    elif len(sys.argv) == 4 and sys.argv[1] == "open":
        open_(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
