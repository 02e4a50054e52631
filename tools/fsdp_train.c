/* fsdp_train.c: fsdp-train, the config-file trainer. Parses the command line and the config
 * (tools/train_config.c), then runs the training it describes (tools/trainer.c) on the ranks
 * [parallel] asks for: rank threads, or this process's rank under mpirun.
 * Exit status: 0 success, 1 the run failed, 2 bad command line or config. */
#include <stdio.h>
#include <string.h>

#include "fsdp/fsdp.h"
#include "train_config.h" // defines: train_cli_parse, train_config_print_help
#include "trainer.h"      // defines: train_run

enum { EXIT_OK = 0, EXIT_RUN_FAILED = 1, EXIT_USAGE = 2 };

static int print_version(void) {
    if (strcmp(fsdp_version(), FSDP_VERSION_STRING) == 0)
        printf("fsdp-train %s\n", FSDP_VERSION_STRING);
    else
        printf("fsdp-train %s (libfsdp %s)\n", FSDP_VERSION_STRING, fsdp_version());
    return EXIT_OK;
}

int main(int argc, char **argv) {
    static train_config cfg; /* large: keep it off the stack */
    char err[TRAIN_ERROR_SIZE] = "";
    train_cli_action action;
    if (train_cli_parse(argc, argv, &cfg, &action, err, sizeof err) != FSDP_OK) {
        fprintf(stderr, "fsdp-train: %s\n", err);
        return EXIT_USAGE;
    }
    if (action == TRAIN_CLI_HELP) {
        train_config_print_help(stdout);
        return EXIT_OK;
    }
    if (action == TRAIN_CLI_VERSION) return print_version();

    fsdp_ctx_options opts = train_config_ctx_options(&cfg);
    fsdp_ctx *ctx = NULL;
    if (fsdp_ctx_create(&opts, &ctx) != FSDP_OK) {
        fprintf(stderr, "fsdp-train: cannot create the context (out of memory?)\n");
        return EXIT_RUN_FAILED;
    }
    train_result res;
    fsdp_status st = train_run(ctx, &cfg, stdout, &res, err, sizeof err);
    /* Once the ranks have run, every process has the same outcome: rank 0 tells it. Before
     * (res.rank -1: the world could not be made or laid out) each process does. */
    if (st != FSDP_OK && res.rank <= 0)
        fprintf(stderr, "fsdp-train: %s (%s)\n", err, fsdp_status_to_string(st));
    fsdp_ctx_free(ctx);
    if (st == FSDP_OK) return EXIT_OK;
    return st == FSDP_ERR_CONFIG ? EXIT_USAGE : EXIT_RUN_FAILED;
}
