/* ckpt_cli.c: what fsdp-ckpt's commands share (ckpt_cli.h): the command line of a command
 * (getopt_long over its options) and opening the checkpoint a DIR argument names. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "ckpt_cli.h"

#include <assert.h>
#include <getopt.h> /* defines: getopt_long, struct option, optarg, optind, optopt */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

bool ckpt_is_help(const char *a) {
    return !strcmp(a, "--help") || !strcmp(a, "-h");
}

/* Prints "fsdp-ckpt CMD: PROBLEM" and cmd's usage; returns EXIT_USAGE. */
int ckpt_usage_error(const char *cmd, const char *usage, const char *problem) {
    fprintf(stderr, "fsdp-ckpt %s: %s\n%s", cmd, problem, usage);
    return EXIT_USAGE;
}

/* The argument getopt_long refused (code c) as a problem for usage_error, into what. */
static void refused_argument(int c, char **argv, const opt_spec *specs, char *what, size_t size) {
    if (c == ':')
        snprintf(what, size, "--%s needs a value", specs[optopt - OPT_BASE].name);
    else if (optopt >= OPT_BASE) /* --flag=VALUE */
        snprintf(what, size, "--%s takes no value", specs[optopt - OPT_BASE].name);
    else if (optopt) /* an unknown short option */
        snprintf(what, size, "unexpected argument '-%c'", optopt);
    else
        snprintf(what, size, "unexpected argument '%s'", argv[optind - 1]);
}

/* Whether a, given as an option's value in the next argument, is an option instead ("--..."
 * or "-h"): a forgotten value, as in --out --with-optim, which getopt_long would take. */
static bool looks_like_option(const char *a) {
    return !strncmp(a, "--", 2) || !strcmp(a, "-h");
}

/* Parses the arguments of cmd (argv[0] is the command's name) with getopt_long: --help or -h,
 * the n_specs options of specs (also as --name=VALUE), and at most max_pos positional
 * arguments, into pos[0..] in their order (those not given stay as they were). Options and
 * positional arguments mix in any order; after "--" every argument is positional. A value in
 * the next argument may not start with "--" or be "-h" (--name=VALUE may). Returns -1 when the
 * command goes on, EXIT_OK after printing usage for --help, EXIT_USAGE after printing the
 * problem and usage. */
int ckpt_parse_args(const char *cmd, const char *usage, int argc, char **argv,
                    const opt_spec *specs, int n_specs, const char **pos, int max_pos) {
    assert(n_specs <= MAX_OPTS);
    struct option longopts[MAX_OPTS + 2] = {{.name = "help", .has_arg = no_argument, .val = 'h'}};
    for (int i = 0; i < n_specs; i++)
        longopts[i + 1] = (struct option){
            .name = specs[i].name,
            .has_arg = specs[i].value ? required_argument : no_argument,
            .val = OPT_BASE + i,
        };
    char what[600];
    int n_pos = 0, c;
    optind = 1;
    /* "-": positional arguments come back in their place as code 1, whatever POSIXLY_CORRECT
     * says; ":": getopt prints nothing and answers ':' for a missing value. */
    while ((c = getopt_long(argc, argv, "-:h", longopts, NULL)) != -1) {
        if (c == 'h') return printf("%s", usage), EXIT_OK;
        if (c >= OPT_BASE && c < OPT_BASE + n_specs) {
            const opt_spec *o = &specs[c - OPT_BASE];
            if (o->value && optarg == argv[optind - 1] && looks_like_option(optarg)) {
                snprintf(what, sizeof what,
                         "--%s needs a value, got the option '%s'; to give a value that starts "
                         "with '-', write --%s=%s",
                         o->name, optarg, o->name, optarg);
                return ckpt_usage_error(cmd, usage, what);
            }
            if (o->value)
                *o->value = optarg;
            else
                *o->flag = true;
            continue;
        }
        if (c == 1 && n_pos < max_pos) {
            pos[n_pos++] = optarg;
            continue;
        }
        if (c == 1)
            snprintf(what, sizeof what, "unexpected argument '%s'", optarg);
        else
            refused_argument(c, argv, specs, what, sizeof what);
        return ckpt_usage_error(cmd, usage, what);
    }
    for (; optind < argc; optind++) {
        if (n_pos == max_pos) {
            snprintf(what, sizeof what, "unexpected argument '%s'", argv[optind]);
            return ckpt_usage_error(cmd, usage, what);
        }
        pos[n_pos++] = argv[optind];
    }
    return -1;
}

/* The arguments of a command that takes DIR and no option (inspect, verify), as parse_args. */
int ckpt_parse_dir(const char *cmd, const char *usage, int argc, char **argv, const char **dir) {
    int rc = ckpt_parse_args(cmd, usage, argc, argv, NULL, 0, dir, 1);
    return rc < 0 && !*dir ? ckpt_usage_error(cmd, usage, "needs DIR") : rc;
}

bool ckpt_file_exists(const char *dir, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Opens DIR: a checkpoint itself (it has metadata.h5) or the newest under a root. Prints the
 * problem and its fix on failure. */
fsdp_ckpt *ckpt_open_arg(fsdp_ctx *ctx, const char *cmd, const char *arg) {
    char *path = NULL;
    if (ckpt_file_exists(arg, "metadata.h5")) {
        path = strdup(arg);
    } else if (fsdp_ckpt_latest(ctx, arg, &path) != FSDP_OK) {
        fprintf(stderr,
                "fsdp-ckpt %s: '%s' is neither a checkpoint (no metadata.h5) nor a directory "
                "holding a committed step-XXXXXXXX: %s\n  pass a checkpoint directory or the "
                "directory a run saved into\n",
                cmd, arg, fsdp_last_error(ctx));
        return NULL;
    }
    fsdp_ckpt *ck = NULL;
    if (!path || fsdp_ckpt_open(ctx, path, &ck) != FSDP_OK) {
        fprintf(stderr, "fsdp-ckpt %s: %s\n", cmd, path ? fsdp_last_error(ctx) : "out of memory");
        if (path && ckpt_file_exists(path, "metadata.h5") && !ckpt_file_exists(path, "commit"))
            fprintf(stderr,
                    "  the save never committed (interrupted?): use an earlier step, or the "
                    "root directory to take the newest committed one\n");
        ck = NULL;
    }
    free(path);
    return ck;
}
