/* tool_fs.c: the tools' scratch directories (tool_fs.h). */
#define _POSIX_C_SOURCE 200809L // mkdtemp, lstat

#include "tool_fs.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool tool_make_scratch_dir(const char *name, char *out, size_t size) {
    const char *base = getenv("TMPDIR");
    int n = snprintf(out, size, "%s/%s-XXXXXX", base && *base ? base : "/tmp", name);
    if (n < 0 || (size_t)n >= size) {
        errno = ENAMETOOLONG;
        return false;
    }
    return mkdtemp(out) != NULL;
}

void tool_remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        remove(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        char *child = malloc(len);
        if (!child) continue; /* left behind rather than stopping the rest */
        snprintf(child, len, "%s/%s", path, e->d_name);
        struct stat sb;
        if (lstat(child, &sb) == 0 && S_ISDIR(sb.st_mode))
            tool_remove_tree(child);
        else
            remove(child);
        free(child);
    }
    closedir(d);
    rmdir(path);
}
