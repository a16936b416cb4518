#define _GNU_SOURCE 1
#define FUSE_USE_VERSION 312
#include "cubiqfuse.h"
#include <fuse3/fuse_lowlevel.h>
#include <linux/fuse.h>
#include <stddef.h>
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

static int want_killpriv_v2;
static long only_uid = -1;
/* FUSE_INIT's flags as the kernel sent them; set once the read hook saw FUSE_INIT, which
 * proves every request passes through it (libfuse may otherwise splice them past it). */
static _Atomic int init_seen;
static _Atomic uint32_t kernel_flags;
static _Atomic int killpriv_v2;
static __thread int init_reply_next;
static __thread int request_kills;

static uint32_t field32(const char *buf, size_t len, size_t off) {
    uint32_t v = 0;
    if (off + sizeof v <= len) memcpy(&v, buf + off, sizeof v);
    return v;
}

/* Requests whose permission a local file system checks against the caller (a name looked
 * up, made, removed or moved; a file opened; attributes or xattrs changed or read), not those
 * on a descriptor already open (read, write, fstat, close). */
static int checked_against_caller(uint32_t opcode) {
    switch (opcode) {
    case FUSE_LOOKUP: case FUSE_SETATTR: case FUSE_READLINK: case FUSE_SYMLINK: case FUSE_MKNOD:
    case FUSE_MKDIR: case FUSE_UNLINK: case FUSE_RMDIR: case FUSE_RENAME: case FUSE_RENAME2:
    case FUSE_LINK: case FUSE_OPEN: case FUSE_OPENDIR: case FUSE_CREATE: case FUSE_SETXATTR:
    case FUSE_GETXATTR: case FUSE_LISTXATTR: case FUSE_REMOVEXATTR: case FUSE_ACCESS:
        return 1;
    default:
        return 0;
    }
}

static ssize_t hook_read(int fd, void *buf, size_t len, void *userdata) {
    (void)userdata;
    ssize_t n;
    for (;;) {
        n = read(fd, buf, len);
        if (only_uid < 0 || n < (ssize_t)sizeof(struct fuse_in_header)) break;
        const struct fuse_in_header *in = buf;
        if ((long)in->uid == only_uid || !checked_against_caller(in->opcode)) break;
        /* A mount that is its mounter's alone, without the kernel's check: a process of the
         * mounter's that took another file-system uid (setfsuid, with capabilities) is the
         * only other caller. It is refused what a local disk would check, rather than let in
         * unchecked. */
        struct fuse_out_header out = { .len = sizeof out, .error = -EACCES, .unique = in->unique };
        (void)write(fd, &out, sizeof out);
    }
    request_kills = 0;
    if (n < (ssize_t)sizeof(struct fuse_in_header)) return n;
    const char *b = buf;
    size_t got = (size_t)n, at = sizeof(struct fuse_in_header);
    uint32_t opcode = field32(b, got, offsetof(struct fuse_in_header, opcode));
    switch (opcode) {
    case FUSE_INIT:
        atomic_store(&kernel_flags, field32(b, got, at + offsetof(struct fuse_init_in, flags)));
        atomic_store(&init_seen, 1);
        break;
    case FUSE_WRITE:
        if (atomic_load(&killpriv_v2))
            request_kills = (field32(b, got, at + offsetof(struct fuse_write_in, write_flags)) & FUSE_WRITE_KILL_SUIDGID) != 0;
        break;
    case FUSE_SETATTR:
        if (atomic_load(&killpriv_v2))
            request_kills = (field32(b, got, at + offsetof(struct fuse_setattr_in, valid)) & FATTR_KILL_SUIDGID) != 0;
        break;
    case FUSE_OPEN:
        if (atomic_load(&killpriv_v2))
            request_kills = (field32(b, got, at + offsetof(struct fuse_open_in, open_flags)) & FUSE_OPEN_KILL_SUIDGID) != 0;
        break;
    case FUSE_CREATE:
        if (atomic_load(&killpriv_v2))
            request_kills = (field32(b, got, at + offsetof(struct fuse_create_in, open_flags)) & FUSE_OPEN_KILL_SUIDGID) != 0;
        break;
    default:
        break;
    }
    return n;
}

static ssize_t hook_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    if (init_reply_next) {
        init_reply_next = 0;
        if (want_killpriv_v2 && atomic_load(&init_seen) && (atomic_load(&kernel_flags) & FUSE_HANDLE_KILLPRIV_V2) &&
            count >= 2 && iov[0].iov_len >= sizeof(struct fuse_out_header) &&
            ((struct fuse_out_header *)iov[0].iov_base)->error == 0 &&
            iov[1].iov_len >= offsetof(struct fuse_init_out, flags) + sizeof(uint32_t)) {
            struct fuse_init_out *out = iov[1].iov_base;
            out->flags |= FUSE_HANDLE_KILLPRIV_V2;
            /* Before the kernel has the answer: its next requests may be read by other threads. */
            atomic_store(&killpriv_v2, 1);
        }
    }
    return writev(fd, iov, count);
}

int cubiqfuse_install_io(struct fuse_session *se, int killpriv, long only) {
    static const struct fuse_custom_io io = { .writev = hook_writev, .read = hook_read };
    want_killpriv_v2 = killpriv;
    only_uid = only;
    atomic_store(&init_seen, 0);
    atomic_store(&killpriv_v2, 0);
    return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

void cubiqfuse_init_reply_follows(void) { init_reply_next = 1; }

int cubiqfuse_killpriv_v2(void) { return atomic_load(&killpriv_v2); }

int cubiqfuse_request_kills_suidgid(void) { return request_kills; }

/* include/uapi/linux/fuse.h, 7.44 (Linux 6.16); Debian 12's header is older. */
#define UBIQ_FUSE_NOTIFY_INC_EPOCH 8

int cubiqfuse_notify_inc_epoch(struct fuse_session *se) {
    struct fuse_out_header out = { .len = sizeof out, .error = UBIQ_FUSE_NOTIFY_INC_EPOCH, .unique = 0 };
    ssize_t n = write(fuse_session_fd(se), &out, sizeof out);
    return n < 0 ? -errno : 0;
}
