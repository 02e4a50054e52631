/* ckpt_cli.h: what fsdp-ckpt's commands (fsdp_ckpt.c, ckpt_generate.c) share: the exit
 * statuses, one command's options and arguments, and the checkpoint a DIR argument names. */
#ifndef FSDP_TOOLS_CKPT_CLI_H
#define FSDP_TOOLS_CKPT_CLI_H

#include <stdbool.h>

#include "fsdp/fsdp.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

/* One long option of a command: --name VALUE sets *value, or --name (no value) sets *flag. */
typedef struct opt_spec {
    const char *name;
    const char **value; /* NULL for a flag */
    bool *flag;         /* NULL for an option with a value */
} opt_spec;

enum { MAX_OPTS = 12, OPT_BASE = 256 }; /* getopt_long's code for specs[i] is OPT_BASE + i */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* "--help" or "-h". */
bool ckpt_is_help(const char *a);

/* Prints "fsdp-ckpt CMD: PROBLEM" and cmd's usage; returns EXIT_USAGE. */
int ckpt_usage_error(const char *cmd, const char *usage, const char *problem);

/* Parses the arguments of cmd (argv[0] is the command's name) with getopt_long: --help or -h,
 * the n_specs (at most MAX_OPTS) options of specs (also as --name=VALUE), and at most max_pos
 * positional arguments, into pos[0..] in their order (those not given stay as they were).
 * Options and positional arguments mix in any order; after "--" every argument is positional.
 * A value in the next argument may not start with "--" or be "-h" (a forgotten value: --out
 * --with-optim); --name=VALUE may. Returns -1 when the command goes on, EXIT_OK after printing
 * usage for --help, EXIT_USAGE after printing the problem and usage. */
int ckpt_parse_args(const char *cmd, const char *usage, int argc, char **argv,
                    const opt_spec *specs, int n_specs, const char **pos, int max_pos);

/* The arguments of a command that takes DIR and no option (inspect, verify), as
 * ckpt_parse_args. */
int ckpt_parse_dir(const char *cmd, const char *usage, int argc, char **argv, const char **dir);

/* Whether "dir/name" exists. */
bool ckpt_file_exists(const char *dir, const char *name);

/* Opens DIR: a checkpoint itself (it has metadata.h5) or the newest under a root. Prints the
 * problem and its fix on failure (NULL). The caller closes it. */
fsdp_ckpt *ckpt_open_arg(fsdp_ctx *ctx, const char *cmd, const char *arg);

#endif
