#define _GNU_SOURCE 1
#include "cubiq.h"
#include <fcntl.h>
#include <unistd.h>
#include <errno.h>
#include <sys/xattr.h>
#include <sys/socket.h>

int cubiq_syncfs(int fd) {
    return syncfs(fd);
}

ssize_t cubiq_copy_file_range(int fd_in, int fd_out, size_t len) {
    return copy_file_range(fd_in, NULL, fd_out, NULL, len, 0);
}

ssize_t cubiq_copy_file_range_at(int fd_in, int64_t off_in, int fd_out, int64_t off_out, size_t len) {
    loff_t i = off_in, o = off_out;
    return copy_file_range(fd_in, &i, fd_out, &o, len, 0);
}

int cubiq_fallocate(int fd, int mode, int64_t offset, int64_t len) {
    return fallocate(fd, mode, (off_t)offset, (off_t)len);
}

int cubiq_errno(void) { return errno; }

ssize_t cubiq_getxattr(const char *path, const char *name, void *value, size_t size) {
    return getxattr(path, name, value, size);
}

int cubiq_setxattr(const char *path, const char *name, const void *value, size_t size) {
    return setxattr(path, name, value, size, 0);
}

int64_t cubiq_peer_uid(int fd) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    return (int64_t)cred.uid;
}
