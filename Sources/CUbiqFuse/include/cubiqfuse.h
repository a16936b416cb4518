#ifndef CUBIQFUSE_H
#define CUBIQFUSE_H
#include <stdint.h>

struct fuse_session;

/* What libfuse 3.14 does not pass on, taken from the FUSE device's traffic itself
 * (fuse_session_custom_io over the descriptor fuse_session_mount opened):
 * FUSE_HANDLE_KILLPRIV_V2. With it the kernel stops asking for `security.capability` before
 * every write (it marks inodes S_NOSEC), stops a GETATTR before each chown, and leaves the
 * clearing of setuid/setgid to the file system, flagging each write, truncation and O_TRUNC
 * open that must clear them. docs/kernel-options.md. */

/// Puts the hooks on `se` (after fuse_session_mount). `killpriv_v2`: ask for it when the
/// kernel offers it. `only_uid`: the mount is its mounter's alone and has no
/// `default_permissions` (-1: not so); a request from a caller whose file-system uid is not
/// this one (a process with capabilities after setfsuid, the only other that gets in) that a
/// local disk would check against its caller is answered EACCES here. 0 on success.
int cubiqfuse_install_io(struct fuse_session *se, int killpriv_v2, long only_uid);

/// Has the kernel treat every name it holds on the mount as stale, so the next walk through
/// one asks again (FUSE_NOTIFY_INC_EPOCH, Linux 6.16). Takes no lock in the kernel, so it
/// may be sent while a request is being served. 0, or -errno (-EINVAL: an older kernel).
int cubiqfuse_notify_inc_epoch(struct fuse_session *se);

/// Called in libfuse's init callback: the next reply this thread sends answers FUSE_INIT.
void cubiqfuse_init_reply_follows(void);

/// Whether FUSE_HANDLE_KILLPRIV_V2 was agreed with the kernel.
int cubiqfuse_killpriv_v2(void);

/// Whether the request this thread is serving (read by it last) asks the file system to clear
/// setuid and setgid: FUSE_WRITE_KILL_SUIDGID on a write, FATTR_KILL_SUIDGID on a setattr,
/// FUSE_OPEN_KILL_SUIDGID on an open or a create. Always 0 without KILLPRIV_V2.
int cubiqfuse_request_kills_suidgid(void);

#endif
