/* shell.c: fsdp_test_shell, popen and read to the end into a growing buffer; fsdp_test_spawn,
 * posix_spawn with stdout and stderr into a file. */
#define _POSIX_C_SOURCE 200809L // popen, pclose, posix_spawn

#include "shell.h"

#include <fcntl.h>
#include <spawn.h>
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
        char *grown = realloc(text, cap *= 2);
        if (!grown) {
            free(text);
            pclose(p);
            abort();
        }
        *output = text = grown;
    }
    text[len] = '\0';
    *output = text;
    int status = pclose(p);
    return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

pid_t fsdp_test_spawn(const char *const *argv, const char *log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    extern char **environ;
    fflush(stdout);
    if (posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}
