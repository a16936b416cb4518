#ifndef CUBIQ_H
#define CUBIQ_H
#include <sys/types.h>
#include <stdint.h>

/* GNU-only system calls that Swift's Glibc module does not expose. */
ssize_t cubiq_copy_file_range(int fd_in, int fd_out, size_t len);
/// copy_file_range(2) between explicit offsets (neither descriptor's position moves).
ssize_t cubiq_copy_file_range_at(int fd_in, int64_t off_in, int fd_out, int64_t off_out, size_t len);
int cubiq_fallocate(int fd, int mode, int64_t offset, int64_t len);
int cubiq_errno(void);
/// syncfs(2): makes every file of the file system `fd` is on durable.
int cubiq_syncfs(int fd);
/// The user id of the process at the other end of a Unix socket (SO_PEERCRED); -1 on failure.
int64_t cubiq_peer_uid(int fd);
ssize_t cubiq_getxattr(const char *path, const char *name, void *value, size_t size);
int cubiq_setxattr(const char *path, const char *name, const void *value, size_t size);

#endif
