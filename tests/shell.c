/* shell.c: fsdp_test_shell, popen and read to the end into a growing buffer. */
#define _POSIX_C_SOURCE 200809L // popen, pclose

#include "shell.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

int fsdp_test_shell(const char *command, char **output) {
    size_t len = 0, cap = 1 << 16;
    char *text = malloc(cap);
    if (!text) abort();
    text[0] = '\0';
    *output = text;
    fflush(stdout);
    FILE *p = popen(command, "r");
    if (!p) return -1;
    for (size_t got; (got = fread(text + len, 1, cap - len - 1, p)) > 0;) {
        len += got;
        if (cap - len > 1) continue;
        text = realloc(text, cap *= 2);
        if (!text) abort();
    }
    text[len] = '\0';
    *output = text;
    int status = pclose(p);
    return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
