/* shell.h: running a shell command from a test and reading everything it prints; starting a
 * program in the background. */
#ifndef FSDP_TESTS_SHELL_H
#define FSDP_TESTS_SHELL_H

#include <sys/types.h> // defines: pid_t

/* Runs `command` under /bin/sh (add 2>&1 to it to capture stderr too); *output receives all it
 * printed on stdout, NUL-terminated and malloc'ed (the caller frees it; empty when the command
 * could not start). Returns its exit status, -1 when it did not exit normally or could not
 * start. Flushes stdout first, so the test's own output keeps its order. Aborts when memory
 * runs out: a test cannot go on without it. */
int fsdp_test_shell(const char *command, char **output);

/* Starts argv[0] (a path) with argv (NULL-terminated), its stdout and stderr into the file log
 * (truncated), without waiting for it. Returns its pid, or -1 when it could not start. */
pid_t fsdp_test_spawn(const char *const *argv, const char *log);

#endif
