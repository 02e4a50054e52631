/* train_config.h: fsdp-train's configuration. One table of keys drives the INI parser
 * (libinih), --set overrides, validation and --help, so they cannot drift apart. */
#ifndef FSDP_TOOLS_TRAIN_CONFIG_H
#define FSDP_TOOLS_TRAIN_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fsdp/fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_MAX_LIST   16   /* entries of an int-list key */
#define TRAIN_MAX_STRING 512  /* bytes of a string key, with its terminating NUL */
#define TRAIN_MAX_KEYS   32   /* keys in the table */
#define TRAIN_MAX_ORIGIN 160  /* bytes of one origin text */
#define TRAIN_ERROR_SIZE 1024 /* a good size for the err buffers below */

typedef struct train_int_list {
    int n;
    int64_t v[TRAIN_MAX_LIST];
} train_int_list;

/* The values of every key (see train_config_print_help for their meaning and defaults). */
typedef struct train_config {
    struct {
        train_int_list widths; /* input, hidden..., output */
        fsdp_activation activation;
    } model;
    struct {
        int64_t samples;
        int64_t batch_size;
        int64_t seed;
        train_int_list teacher_widths; /* hidden widths only */
        double noise;
    } data;
    struct {
        double lr;
        double momentum;
        double weight_decay;
        bool nesterov;
    } optim;
    struct {
        int64_t steps;
        int64_t seed;
        int64_t log_every;
    } train;
    struct {
        fsdp_log_level level;
        char metrics[TRAIN_MAX_STRING]; /* "" for none */
    } log;
    /* Where each key's value came from, by table index: "default", "run.ini:12" or
     * "--set optim.lr=0.1". */
    char origin[TRAIN_MAX_KEYS][TRAIN_MAX_ORIGIN];
} train_config;

/* Sets every key to its default. */
void train_config_init(train_config *cfg);

/* Reads an INI file over cfg. On failure returns FSDP_ERR_IO (file cannot be opened) or
 * FSDP_ERR_CONFIG and writes "FILE:LINE: what is wrong; what is allowed" into err; cfg then
 * holds the keys read before the bad line. */
fsdp_status train_config_load(train_config *cfg, const char *path, char *err, size_t err_size);

/* Applies one "section.key=value" override, validated like a line of the file; an error
 * names the argument. Returns FSDP_ERR_CONFIG on failure. */
fsdp_status train_config_set(train_config *cfg, const char *assignment, char *err, size_t err_size);

/* Checks rules that join several keys (nesterov needs momentum). FSDP_ERR_CONFIG on failure. */
fsdp_status train_config_check(const train_config *cfg, char *err, size_t err_size);

/* The origin text of a key ("default", "run.ini:12", ...), or NULL for an unknown key. */
const char *train_config_origin(const train_config *cfg, const char *section, const char *name);

/* Writes the effective configuration as an INI file, each key followed by a comment naming
 * where its value came from. */
void train_config_write(const train_config *cfg, FILE *f);

/* Writes the usage, the options and every section and key with type, default and meaning. */
void train_config_print_help(FILE *f);

typedef enum train_cli_action {
    TRAIN_CLI_RUN = 0,
    TRAIN_CLI_HELP,
    TRAIN_CLI_VERSION
} train_cli_action;

/* Parses fsdp-train's arguments (argv[0] is the program): --config FILE, --set A (repeatable,
 * applied after the file in the order given), --help, --version. For TRAIN_CLI_RUN, cfg holds
 * the checked configuration. Errors (FSDP_ERR_CONFIG or FSDP_ERR_IO) are written into err. */
fsdp_status train_cli_parse(int argc, char **argv, train_config *cfg, train_cli_action *action,
                            char *err, size_t err_size);

/* Appends printf-style text to the NUL-terminated buf of `size` bytes, truncating. */
void train_append(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Context options for a run: seed = train.seed, log level = log.level. */
fsdp_ctx_options train_config_ctx_options(const train_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
