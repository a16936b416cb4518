#ifndef UBIQ_CFUSE_SHIM_H
#define UBIQ_CFUSE_SHIM_H
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <fcntl.h>
#include <errno.h>
#include <unistd.h>

/* Function-like macros do not import into Swift: wrap them. */
static inline int ubiq_fuse_loop_mt(struct fuse_session *se, unsigned max_idle, unsigned max_threads) {
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    if (!cfg) return -1;
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    fuse_loop_cfg_set_idle_threads(cfg, max_idle);
    fuse_loop_cfg_set_max_threads(cfg, max_threads);
    int r = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
    return r;
}

static inline struct fuse_session *ubiq_fuse_session_new(int argc, char **argv,
        const struct fuse_lowlevel_ops *ops, void *userdata) {
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_session *se = fuse_session_new(&args, ops, sizeof(*ops), userdata);
    fuse_opt_free_args(&args);
    return se;
}

/* fuse_file_info bit-fields, set from Swift through these helpers. */
static inline void ubiq_fi_set_keep_cache(struct fuse_file_info *fi, int v) { fi->keep_cache = v ? 1 : 0; }
static inline void ubiq_fi_set_direct_io(struct fuse_file_info *fi, int v) { fi->direct_io = v ? 1 : 0; }
static inline void ubiq_fi_set_cache_readdir(struct fuse_file_info *fi, int v) { fi->cache_readdir = v ? 1 : 0; }
static inline void ubiq_fi_set_nonseekable(struct fuse_file_info *fi, int v) { fi->nonseekable = v ? 1 : 0; }
static inline int ubiq_fi_flags(const struct fuse_file_info *fi) { return fi->flags; }

static inline int ubiq_errno(void) { return errno; }

/* Negotiates what ubiq asks of the kernel; see docs/posix.md "Kernel options". */
static inline void ubiq_conn_configure(struct fuse_conn_info *conn, unsigned max_write) {
    conn->max_write = max_write;
    conn->max_readahead = max_write;
    conn->time_gran = 1;
    /* Never the writeback cache: with it the kernel keeps its own size of a file, and a
       version from another device would read cut short or run on (docs/kernel-options.md). */
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
    /* The kernel drops a file's cached pages only when ubiq says so (another device's version,
       an eviction, an append moved to the end), never on its own because the mtime or size it
       was told moved: it dropped them while a write through them was on its way to ubiq, and a
       read in between cached the file's old end with zeros after it, which readers of the
       appended lines then read (docs/kernel-options.md). */
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
    if (conn->capable & FUSE_CAP_EXPLICIT_INVAL_DATA) conn->want |= FUSE_CAP_EXPLICIT_INVAL_DATA;
    if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
    if (conn->capable & FUSE_CAP_READDIRPLUS_AUTO) conn->want |= FUSE_CAP_READDIRPLUS_AUTO;
    if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
    if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
    /* File handles (name_to_handle_at, NFS export) that outlive the kernel's cache and a
       remount: it looks an inode it does not hold up by number, as "." of it
       (docs/kernel-options.md). */
    if (conn->capable & FUSE_CAP_EXPORT_SUPPORT) conn->want |= FUSE_CAP_EXPORT_SUPPORT;
    /* Splice moves pages without a copy; measured in scripts/bench. */
    conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
}

static inline void ubiq_ns_to_ts(long long ns, struct timespec *ts) {
    long long s = ns / 1000000000LL, r = ns % 1000000000LL;
    if (r < 0) { r += 1000000000LL; s -= 1; }
    ts->tv_sec = s; ts->tv_nsec = r;
}

static inline void ubiq_stat_set_times(struct stat *st, long long a, long long m, long long c) {
    ubiq_ns_to_ts(a, &st->st_atim); ubiq_ns_to_ts(m, &st->st_mtim); ubiq_ns_to_ts(c, &st->st_ctim);
}

static inline long long ubiq_stat_atime(const struct stat *st) { return (long long)st->st_atim.tv_sec * 1000000000LL + st->st_atim.tv_nsec; }
static inline long long ubiq_stat_mtime(const struct stat *st) { return (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec; }

#endif
