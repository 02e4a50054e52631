/* bench_cli.h: the command line every benchmark shares, the convention of fsdp-train and
 * fsdp-ckpt: --help or -h prints the usage to stdout and exits 0, doing nothing else; an
 * unknown option or a bad value prints "NAME: PROBLEM" and the usage to stderr and exits 2. */
#ifndef FSDP_BENCH_CLI_H
#define FSDP_BENCH_CLI_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BENCH_EXIT_USAGE = 2 };

/* When any argument is --help or -h: prints usage to stdout and exits 0 (1 when stdout cannot
 * be written). */
static inline void bench_cli_help(int argc, char **argv, const char *usage) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") && strcmp(argv[i], "-h")) continue;
        fputs(usage, stdout);
        exit(fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1);
    }
}

/* Prints "name: PROBLEM" (fmt, printf-style) and usage to stderr; exits 2. */
static inline void bench_cli_fail(const char *name, const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
static inline void bench_cli_fail(const char *name, const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", name);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n%s", usage);
    exit(BENCH_EXIT_USAGE);
}

/* The value of option opt (argv[*i]): the next argument, which must exist and not be an option;
 * advances *i. Fails (bench_cli_fail) otherwise. */
static inline const char *bench_cli_value(const char *name, const char *usage, int argc,
                                          char **argv, int *i) {
    const char *opt = argv[*i];
    if (*i + 1 >= argc || (argv[*i + 1][0] == '-' && argv[*i + 1][1] == '-'))
        bench_cli_fail(name, usage, "%s needs a value", opt);
    return argv[++*i];
}

/* v as a whole integer in [lo, hi]; fails (bench_cli_fail) naming opt otherwise. */
static inline long long bench_cli_int(const char *name, const char *usage, const char *opt,
                                      const char *v, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi)
        bench_cli_fail(name, usage, "%s wants an integer in [%lld, %lld], got '%s'", opt, lo, hi,
                       v);
    return n;
}

/* v, comma-separated integers in [1, 1 << 20], into widths[0..max): their count, at least
 * min_n; fails (bench_cli_fail) naming opt otherwise. */
static inline int bench_cli_widths(const char *name, const char *usage, const char *opt,
                                   const char *v, long long *widths, int min_n, int max) {
    int n = 0;
    for (const char *s = v;; s++) {
        char *end;
        errno = 0;
        long long w = strtoll(s, &end, 10);
        if (errno || end == s || w < 1 || w > (1 << 20) || n == max || (*end && *end != ',')) break;
        widths[n++] = w;
        if (!*end) {
            if (n >= min_n) return n;
            break;
        }
        s = end;
    }
    bench_cli_fail(name, usage,
                   "%s wants %d to %d widths in [1, 1048576], comma-separated, got '%s'", opt,
                   min_n, max, v);
}

#endif
