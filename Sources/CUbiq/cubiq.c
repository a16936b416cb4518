#define _GNU_SOURCE 1
#include "cubiq.h"
#include <fcntl.h>
#include <unistd.h>
#include <errno.h>
#include <malloc.h>
#include <sys/xattr.h>
#include <sys/socket.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

int cubiq_syncfs(int fd) {
    return syncfs(fd);
}

int cubiq_start_writeback(int fd, int64_t off, int64_t len) {
    return sync_file_range(fd, off, len, SYNC_FILE_RANGE_WRITE);
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

void *cubiq_sha256_new(void) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) { EVP_MD_CTX_free(ctx); return NULL; }
    return ctx;
}

void *cubiq_sha256_copy(const void *ctx) {
    EVP_MD_CTX *copy = EVP_MD_CTX_new();
    if (copy && EVP_MD_CTX_copy_ex(copy, ctx) != 1) { EVP_MD_CTX_free(copy); return NULL; }
    return copy;
}

int cubiq_sha256_update(void *ctx, const void *data, size_t len) { return EVP_DigestUpdate(ctx, data, len); }

int cubiq_sha256_final(void *ctx, uint8_t *out) {
    unsigned int n = 0;
    return EVP_DigestFinal_ex(ctx, out, &n) == 1 && n == 32;
}

void cubiq_sha256_free(void *ctx) { EVP_MD_CTX_free(ctx); }

int cubiq_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len, uint8_t *out) {
    unsigned int n = 0;
    return HMAC(EVP_sha256(), key, (int)key_len, data, len, out, &n) != NULL && n == 32;
}

int cubiq_release_free_memory(void) { return malloc_trim(0); }
