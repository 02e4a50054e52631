/* block_open.c: an LD_PRELOAD library for tests: an open() of a path that ends in
 * $FSDP_TEST_BLOCK_OPEN never returns (the calling thread sleeps, as on a file system that does
 * not answer); every other open() is the C library's. Lets a test leave one rank thread stuck
 * inside an HDF5 call (HDF5 opens its files with open()). */
#define _GNU_SOURCE // RTLD_NEXT
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int blocked(const char *path) {
    const char *suffix = getenv("FSDP_TEST_BLOCK_OPEN");
    size_t n = path ? strlen(path) : 0, m = suffix ? strlen(suffix) : 0;
    return m > 0 && n >= m && strcmp(path + n - m, suffix) == 0;
}

static int forward(const char *name, const char *path, int flags, va_list ap) {
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
    if (blocked(path))
        for (;;) pause();
    int (*real)(const char *, int, ...) = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, name);
    return real(path, flags, mode);
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int fd = forward("open", path, flags, ap);
    va_end(ap);
    return fd;
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int fd = forward("open64", path, flags, ap);
    va_end(ap);
    return fd;
}
