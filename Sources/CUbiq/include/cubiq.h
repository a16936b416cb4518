#ifndef CUBIQ_H
#define CUBIQ_H
#include <sys/types.h>
#include <stdint.h>
#include <linux/falloc.h>

/* lseek(2) whences that Swift's Glibc module leaves out (GNU). */
#define CUBIQ_SEEK_DATA 3
#define CUBIQ_SEEK_HOLE 4

/* GNU-only system calls that Swift's Glibc module does not expose. */
ssize_t cubiq_copy_file_range(int fd_in, int fd_out, size_t len);
/// sync_file_range(2) with SYNC_FILE_RANGE_WRITE: starts writing the range's dirty pages to the
/// disk and returns (no wait for them, no metadata, no durability promise).
int cubiq_start_writeback(int fd, int64_t off, int64_t len);
/// copy_file_range(2) between explicit offsets (neither descriptor's position moves).
ssize_t cubiq_copy_file_range_at(int fd_in, int64_t off_in, int fd_out, int64_t off_out, size_t len);
int cubiq_fallocate(int fd, int mode, int64_t offset, int64_t len);
int cubiq_errno(void);
/* malloc_trim(3): gives the heap's free pages back to the system; returns 1 if any went. */
int cubiq_release_free_memory(void);
/// syncfs(2): makes every file of the file system `fd` is on durable.
int cubiq_syncfs(int fd);
/// The user id of the process at the other end of a Unix socket (SO_PEERCRED); -1 on failure.
int64_t cubiq_peer_uid(int fd);
ssize_t cubiq_getxattr(const char *path, const char *name, void *value, size_t size);
int cubiq_setxattr(const char *path, const char *name, const void *value, size_t size);

/* SHA-256 and HMAC-SHA-256 from the system's libcrypto (OpenSSL 3; Debian's libssl-dev). */
/// A new SHA-256 context (NULL when out of memory); free it with cubiq_sha256_free.
void *cubiq_sha256_new(void);
/// A copy of `ctx` as it stands (NULL when out of memory).
void *cubiq_sha256_copy(const void *ctx);
int cubiq_sha256_update(void *ctx, const void *data, size_t len);
/// Writes the 32-byte digest to `out`; `ctx` takes no more bytes afterwards.
int cubiq_sha256_final(void *ctx, uint8_t *out);
void cubiq_sha256_free(void *ctx);
/// HMAC-SHA-256 of `data` under `key` into `out` (32 bytes); 1 on success.
int cubiq_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len, uint8_t *out);

#endif
