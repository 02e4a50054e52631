/* fsdp_train.c: fsdp-train, the config-file trainer. Parses the command line and the config
 * (tools/train_read.c), then runs the training it describes (tools/train_world.c) on the ranks
 * [parallel] asks for: rank threads, or this process's rank under mpirun.
 * With [checkpoint] dir set, SIGINT and SIGTERM stop the run after the current step with a
 * checkpoint (a second one ends the process at once).
 * --plan prints the run's estimated memory and communication instead (train_estimate.h).
 * Exit status: 0 success, 1 the run failed (also: stdout could not be written), 2 bad
 * command line or config, 130 stopped by SIGINT or SIGTERM (with a checkpoint saved). */
#define _POSIX_C_SOURCE 200809L // sigaction

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fsdp/fsdp.h"
#include "tool_exit.h" // defines: tool_exit_begin, tool_exit
#include "train_config.h" // defines: train_cli_parse, train_config_print_help, train_config_print_usage
#include "trainer.h"      // defines: train_run

#include "train_estimate.h" // defines: train_estimate_main

enum { EXIT_OK = 0, EXIT_RUN_FAILED = 1, EXIT_USAGE = 2, EXIT_INTERRUPTED = 130 };

/* The way the library's failure came up (docs/comm.md, "Error trails"), a hop a line
 * ("  at file:line (function)"), outermost call first, when the run failed with the failure
 * the context holds. */
static void print_trail(const fsdp_ctx *ctx, fsdp_status st) {
    const char *trail = fsdp_last_error_trail(ctx);
    if (fsdp_last_status(ctx) != st || !trail[0]) return;
    for (const char *hop = trail; hop;) {
        const char *next = strstr(hop, " -> ");
        int len = next ? (int)(next - hop) : (int)strlen(hop);
        fprintf(stderr, "  at %.*s\n", len, hop);
        hop = next ? next + 4 : NULL;
    }
}

/* The exit status once stdout is flushed: a success whose output could not all be written
 * (a full disk, /dev/full) is a failure. */
static int finish(int status) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return status;
    if (status != EXIT_OK) return status; /* told already, or not about stdout */
    fprintf(stderr, "fsdp-train: cannot write to stdout: %s\n",
            errno ? strerror(errno) : "write error");
    return EXIT_RUN_FAILED;
}

static int print_version(void) {
    if (strcmp(fsdp_version(), FSDP_VERSION_STRING) == 0)
        printf("fsdp-train %s\n", FSDP_VERSION_STRING);
    else
        printf("fsdp-train %s (libfsdp %s)\n", FSDP_VERSION_STRING, fsdp_version());
    return EXIT_OK;
}

/* All a handler may do: note the signal. The ranks see it after the step they are in. */
static void on_stop_signal(int sig) {
    train_stop_signal = sig;
}

/* SIGINT and SIGTERM stop the run at a step boundary with a checkpoint (on); the handler is
 * reset when it runs, so a second signal ends the process the default way. Once the ranks are
 * done nothing reads the note any more: the signals end the process again (off). */
static void catch_stop_signals(bool on) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on ? on_stop_signal : SIG_DFL;
    sa.sa_flags = on ? SA_RESETHAND : 0;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* The line of a run stopped by a signal: where it stopped and how to go on. */
static void print_interrupted(const train_config *cfg, const train_result *res) {
    int sig = train_stop_signal;
    const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : NULL;
    fprintf(stderr, "fsdp-train: stopped by %s after step %lld of %lld: saved %s; ",
            name ? name : "a signal to another rank", (long long)res->steps,
            (long long)cfg->train.steps, res->saved);
    if (strcmp(cfg->checkpoint.resume, "auto") == 0)
        fprintf(stderr, "run the same command again to resume from it\n");
    else
        fprintf(stderr, "resume with --set checkpoint.resume=%s\n", res->saved);
}

int main(int argc, char **argv) {
    static train_config cfg; /* large: keep it off the stack */
    char err[TRAIN_ERROR_SIZE] = "";
    tool_exit_begin();
    train_cli_action action;
    if (train_cli_parse(argc, argv, &cfg, &action, err, sizeof err) != FSDP_OK) {
        fprintf(stderr, "fsdp-train: %s\n", err);
        if (action == TRAIN_CLI_BAD_USAGE) train_config_print_usage(stderr);
        return EXIT_USAGE;
    }
    if (action == TRAIN_CLI_HELP) {
        train_config_print_help(stdout);
        return finish(EXIT_OK);
    }
    if (action == TRAIN_CLI_VERSION) return finish(print_version());
    if (action == TRAIN_CLI_PLAN || action == TRAIN_CLI_PLAN_JSON)
        return finish(train_estimate_main(&cfg, action == TRAIN_CLI_PLAN_JSON, stdout));

    fsdp_ctx_options opts = train_config_ctx_options(&cfg);
    fsdp_ctx *ctx = NULL;
    if (fsdp_ctx_create(&opts, &ctx) != FSDP_OK) {
        fprintf(stderr, "fsdp-train: cannot create the context (out of memory?)\n");
        return EXIT_RUN_FAILED;
    }
    if (cfg.checkpoint.dir[0]) catch_stop_signals(true);
    train_result res;
    fsdp_status st = train_run(ctx, &cfg, stdout, &res, err, sizeof err);
    if (cfg.checkpoint.dir[0]) catch_stop_signals(false);
    /* Once the ranks have run, every process has the same outcome: rank 0 tells it. Before
     * (res.rank -1: the world could not be made or laid out) each process does. */
    if (st != FSDP_OK && res.rank <= 0) {
        fprintf(stderr, "fsdp-train: %s (%s)\n", err, fsdp_status_to_string(st));
        print_trail(ctx, st);
    }
    fsdp_ctx_free(ctx);
    if (st == FSDP_OK && res.interrupted) {
        if (res.rank <= 0) print_interrupted(&cfg, &res);
        return tool_exit(finish(EXIT_INTERRUPTED), TOOL_END_CLEAN);
    }
    if (st == FSDP_OK) return tool_exit(finish(EXIT_OK), TOOL_END_CLEAN);
    int status = finish(st == FSDP_ERR_CONFIG ? EXIT_USAGE : EXIT_RUN_FAILED);
    return tool_exit(status, res.threads_left ? TOOL_END_THREADS_LEFT : TOOL_END_FAILED);
}
