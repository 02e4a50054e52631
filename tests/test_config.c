/* test_config.c: fsdp-train's configuration (tools/train_config.c): defaults, a good file,
 * every class of error with the file, line and allowed values in its message, --set and the
 * command line, and --help generated from the same key table as the parser. */
#define _POSIX_C_SOURCE 200809L // mkfifo

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "train_config.h" // defines: train_config_load, train_config_set, train_cli_parse

static train_config g_cfg; /* large: keep it off the stack */

/* Writes n bytes to a fresh file under the build directory; returns its path (static buffer). */
static const char *write_bytes(const char *name, const char *data, size_t n) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/test_config_%s.ini", FSDP_BINARY_DIR, name);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(fwrite(data, 1, n, f), n);
    fclose(f);
    return path;
}

static const char *write_config(const char *name, const char *text) {
    return write_bytes(name, text, strlen(text));
}

/* Loads n bytes (after the defaults) and asserts that they fail with `want` and a message
 * that names the file, "name.ini:LINE:" and every needle. */
static void load_bytes_fails(const char *name, const char *data, size_t n, int line,
                             fsdp_status want, const char *const *needles) {
    char err[TRAIN_ERROR_SIZE] = "";
    const char *path = write_bytes(name, data, n);
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(train_config_load(&g_cfg, path, err, sizeof err), want);
    char where[1100];
    snprintf(where, sizeof where, "%s:%d: ", path, line);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(strncmp(err, where, strlen(where)) == 0);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, needles));
    remove(path);
}

static void load_fails(const char *name, const char *text, int line, fsdp_status want,
                       const char *const *needles) {
    load_bytes_fails(name, text, strlen(text), line, want, needles);
}

/* Loads text (after the defaults) and asserts that it succeeds. */
static void load_ok(const char *name, const char *text) {
    char err[TRAIN_ERROR_SIZE] = "";
    const char *path = write_config(name, text);
    train_config_init(&g_cfg);
    fsdp_status st = train_config_load(&g_cfg, path, err, sizeof err);
    if (st != FSDP_OK) printf("\n    %s", err);
    CU_ASSERT_EQUAL(st, FSDP_OK);
    remove(path);
}

#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})
#define SET(...)     ((const char *const[]){__VA_ARGS__, NULL})

static void test_defaults(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(g_cfg.model.widths.n, 4);
    CU_ASSERT_EQUAL(g_cfg.model.widths.v[0], 32);
    CU_ASSERT_EQUAL(g_cfg.model.widths.v[3], 8);
    CU_ASSERT_EQUAL(g_cfg.model.activation, FSDP_ACT_RELU);
    CU_ASSERT_EQUAL(g_cfg.data.samples, 4096);
    CU_ASSERT_EQUAL(g_cfg.data.batch_size, 64);
    CU_ASSERT_EQUAL(g_cfg.data.teacher_widths.n, 1);
    CU_ASSERT_EQUAL(g_cfg.data.noise, 0.0);
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.lr, 0.2, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.momentum, 0.9, 1e-12);
    CU_ASSERT_FALSE(g_cfg.optim.nesterov);
    CU_ASSERT_EQUAL(g_cfg.train.steps, 5000);
    CU_ASSERT_EQUAL(g_cfg.log.level, FSDP_LOG_INFO);
    CU_ASSERT_STRING_EQUAL(g_cfg.log.metrics, "");
    CU_ASSERT_STRING_EQUAL(train_config_origin(&g_cfg, "optim", "lr"), "default");
    CU_ASSERT_PTR_NULL(train_config_origin(&g_cfg, "optim", "nope"));
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_OK);
    fsdp_ctx_options opts = train_config_ctx_options(&g_cfg);
    CU_ASSERT_EQUAL(opts.seed, 0);
    CU_ASSERT_EQUAL(opts.log_level, FSDP_LOG_INFO);
}

static void test_good_file(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    const char *path = write_config("good", "; a comment\n"
                                            "# another\n"
                                            "[model]\n"
                                            "widths = 16, 32 ,4\n"
                                            "activation = gelu ; inline comment\n"
                                            "\n"
                                            "[data]\n"
                                            "samples = 100\n"
                                            "batch_size = 10\n"
                                            "seed = 7\n"
                                            "teacher_widths =\n"
                                            "noise = 0.01\n"
                                            "[optim]\n"
                                            "lr = 0.5\n"
                                            "momentum = 0.5\n"
                                            "weight_decay = 1e-4\n"
                                            "nesterov = yes\n"
                                            "[train]\n"
                                            "steps = 10\n"
                                            "seed = 3\n"
                                            "log_every = 5\n"
                                            "[log]\n"
                                            "level = debug\n"
                                            "metrics = out/metrics.jsonl\n");
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_load(&g_cfg, path, err, sizeof err));
    CU_ASSERT_STRING_EQUAL(err, "");
    CU_ASSERT_EQUAL(g_cfg.model.widths.n, 3);
    CU_ASSERT_EQUAL(g_cfg.model.widths.v[0], 16);
    CU_ASSERT_EQUAL(g_cfg.model.widths.v[1], 32);
    CU_ASSERT_EQUAL(g_cfg.model.widths.v[2], 4);
    CU_ASSERT_EQUAL(g_cfg.model.activation, FSDP_ACT_GELU);
    CU_ASSERT_EQUAL(g_cfg.data.samples, 100);
    CU_ASSERT_EQUAL(g_cfg.data.batch_size, 10);
    CU_ASSERT_EQUAL(g_cfg.data.seed, 7);
    CU_ASSERT_EQUAL(g_cfg.data.teacher_widths.n, 0);
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.data.noise, 0.01, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.lr, 0.5, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.weight_decay, 1e-4, 1e-12);
    CU_ASSERT_TRUE(g_cfg.optim.nesterov);
    CU_ASSERT_EQUAL(g_cfg.train.steps, 10);
    CU_ASSERT_EQUAL(g_cfg.train.seed, 3);
    CU_ASSERT_EQUAL(g_cfg.train.log_every, 5);
    CU_ASSERT_EQUAL(g_cfg.log.level, FSDP_LOG_DEBUG);
    CU_ASSERT_STRING_EQUAL(g_cfg.log.metrics, "out/metrics.jsonl");
    char want[1100];
    snprintf(want, sizeof want, "%s:14", path);
    CU_ASSERT_STRING_EQUAL(train_config_origin(&g_cfg, "optim", "lr"), want);
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_OK);
    remove(path);
}

static void test_unknown_key(void) {
    load_fails(
        "unknown_key", "[model]\nwidths = 4,4\nlr = 0.1\n", 3, FSDP_ERR_CONFIG,
        NEEDLES("unknown key 'lr' in section [model]", "allowed keys: kind, widths, activation"));
}

static void test_unknown_section(void) {
    const char *const *sections =
        NEEDLES("allowed sections: [model], [parallel], [data], [optim], [train], [checkpoint], "
                "[log]");
    load_fails("unknown_section", "[optim]\nlr = 0.1\n\n[paralel]\ntp = 2\n", 4, FSDP_ERR_CONFIG,
               NEEDLES("unknown section [paralel]", sections[0]));
    /* an empty section is caught too, though libinih never shows it to the handler */
    load_fails("empty_section", "[checkpoints]\n", 1, FSDP_ERR_CONFIG,
               NEEDLES("unknown section [checkpoints]", sections[0]));
    load_fails("no_section", "lr = 0.1\n", 1, FSDP_ERR_CONFIG,
               NEEDLES("key 'lr' is outside any section", sections[0]));
}

static void test_bad_int(void) {
    load_fails("bad_int", "[data]\nsamples = 12x\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value '12x' for [data] samples", "an integer in [1, 100000000]"));
    load_fails("bad_int_empty", "[train]\nsteps =\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value '' for [train] steps", "expected an integer >= 1"));
    load_fails("bad_float", "[optim]\n\nlr = fast\n", 3, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'fast' for [optim] lr", "expected a float > 0"));
    load_fails("bad_bool", "[optim]\nnesterov = maybe\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'maybe' for [optim] nesterov", "true or false"));
}

static void test_out_of_range(void) {
    load_fails("range_int", "[data]\nbatch_size = 0\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value '0' for [data] batch_size", "out of range",
                       "an integer in [1, 10000000]"));
    load_fails("range_overflow", "[train]\nseed = 99999999999999999999\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[train] seed", "out of range", "an integer >= 0"));
    load_fails("range_float", "[optim]\nlr = 0\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value '0' for [optim] lr", "out of range", "a float > 0"));
    load_fails("range_momentum", "[optim]\nmomentum = 1.0\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[optim] momentum", "out of range", "a float >= 0 and < 1"));
    load_fails("range_noise", "[data]\nnoise = -0.1\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[data] noise", "a float >= 0"));
    load_fails("range_nan", "[data]\nnoise = nan\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[data] noise", "a float >= 0"));
}

static void test_bad_enum(void) {
    load_fails("bad_activation", "[model]\nactivation = tanh\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'tanh' for [model] activation", "one of relu, gelu, sigmoid"));
    load_fails(
        "bad_level", "[log]\nlevel = verbose\n", 2, FSDP_ERR_CONFIG,
        NEEDLES("bad value 'verbose' for [log] level", "one of debug, info, warn, error, off"));
}

static void test_bad_list(void) {
    const char *allowed = "a comma-separated list of 2 to 16 integers in [1, 1048576]";
    load_fails(
        "list_item", "[model]\nwidths = 32,x,8\n", 2, FSDP_ERR_CONFIG,
        NEEDLES("bad value '32,x,8' for [model] widths", "entry 2 'x' is not an integer", allowed));
    load_fails("list_range", "[model]\nwidths = 32,0,8\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("entry 2 (0) is out of range", allowed));
    load_fails("list_short", "[model]\nwidths = 32\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("1 entry", allowed));
    load_fails("list_comma", "[model]\nwidths = 32,8,\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("trailing comma", allowed));
    load_fails("list_empty_item", "[model]\nwidths = 32,,8\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("entry 2 '' is not an integer", allowed));
    load_fails("list_long", "[model]\nwidths = 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17\n", 2,
               FSDP_ERR_CONFIG, NEEDLES("more than 16 entries", allowed));
}

static void test_file_structure_errors(void) {
    load_fails("duplicate", "[optim]\nlr = 0.1\nmomentum = 0\nlr = 0.2\n", 4, FSDP_ERR_CONFIG,
               NEEDLES("[optim] lr is set twice (first on line 2)"));
    load_fails(
        "continuation", "[optim]\n  lr = 0.1\n  momentum = 0.5\n", 3, FSDP_ERR_CONFIG,
        NEEDLES("indented line continues the value of [optim] lr", "remove the indentation"));
    load_fails("syntax", "[optim]\nlr = 0.1\nthis is not a key\n", 3, FSDP_ERR_CONFIG,
               NEEDLES("syntax error", "'key = value'"));
    load_fails("syntax_section", "[optim\nlr = 0.1\n", 1, FSDP_ERR_CONFIG,
               NEEDLES("syntax error", "'[section]'"));
    char longline[400];
    snprintf(longline, sizeof longline, "[log]\nmetrics = %0300d\n", 0);
    load_fails("long_line", longline, 2, FSDP_ERR_CONFIG, NEEDLES("line is longer than"));
}

/* A float that overflows a double, or is infinite or NaN, is refused with a message saying so;
 * the largest finite values are accepted. */
static void test_float_overflow(void) {
    load_fails(
        "overflow_lr", "[optim]\nlr = 1e400\n", 2, FSDP_ERR_CONFIG,
        NEEDLES("bad value '1e400' for [optim] lr", "overflows a double", "expected a float > 0"));
    load_fails("overflow_negative", "[data]\nnoise = -1e999\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value '-1e999' for [data] noise", "overflows a double"));
    load_fails("infinite", "[optim]\nweight_decay = inf\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'inf' for [optim] weight_decay", "not a finite number"));
    load_fails("nan", "[optim]\nlr = nan\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'nan' for [optim] lr", "not a finite number"));
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "optim.lr=1e400", err, sizeof err), FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("--set optim.lr=1e400: bad value '1e400' for [optim] lr", "overflows")));
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.lr, 0.2, 1e-12);
    FSDP_TEST_OK(train_config_set(&g_cfg, "optim.lr=1.7976931348623157e308", err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "data.noise=1e-400", err, sizeof err)); /* to 0 */
}

/* NUL bytes anywhere in a file are refused, naming the line and the byte offset of the
 * first: a file of NULs, and a NUL that hid the rest of a comment line from the parser while
 * what followed it became a line of its own (a key smuggled in through a comment). */
static void test_nul_bytes(void) {
    static const char nuls[64] = {0};
    load_bytes_fails("nul_only", nuls, sizeof nuls, 1, FSDP_ERR_CONFIG,
                     NEEDLES("NUL byte at byte offset 0", "text"));
    /* "; a", a NUL, then x's up to the 199 bytes a line read took, so that "lr = 1000" began
     * the next read: the NUL hid the x's and lr was set */
    char smuggle[256] = "[optim]\n; a";
    size_t n = strlen(smuggle) + 1;
    while (n < 8 + 199) smuggle[n++] = 'x';
    memcpy(smuggle + n, "lr = 1000\n", 10), n += 10;
    load_bytes_fails("nul_smuggle", smuggle, n, 2, FSDP_ERR_CONFIG,
                     NEEDLES("NUL byte at byte offset 11"));
    load_bytes_fails("nul_value", "[optim]\nlr = 0.1\0\n", 17, 2, FSDP_ERR_CONFIG,
                     NEEDLES("NUL byte at byte offset 16"));
}

/* A FIFO, a device or a directory is not read (a FIFO would block, /dev/zero never ends). */
static void test_special_files(void) {
    char err[TRAIN_ERROR_SIZE] = "", fifo[1024];
    snprintf(fifo, sizeof fifo, "%s/test_config_fifo.ini", FSDP_BINARY_DIR);
    remove(fifo);
    CU_ASSERT_EQUAL_FATAL(mkfifo(fifo, 0600), 0);
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(train_config_load(&g_cfg, fifo, err, sizeof err), FSDP_ERR_IO);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(
        fsdp_test_message_has(err, NEEDLES("cannot read config", fifo, "not a regular file")));
    remove(fifo);
    CU_ASSERT_EQUAL(train_config_load(&g_cfg, "/dev/zero", err, sizeof err), FSDP_ERR_IO);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("cannot read config '/dev/zero'", "not a regular file")));
    CU_ASSERT_EQUAL(train_config_load(&g_cfg, FSDP_BINARY_DIR, err, sizeof err), FSDP_ERR_IO);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("not a regular file", "a directory")));
}

/* A file of exactly TRAIN_MAX_CONFIG_BYTES bytes loads; one byte more is refused. */
static void test_size_cap(void) {
    size_t cap = TRAIN_MAX_CONFIG_BYTES;
    char *text = malloc(cap + 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    for (size_t i = 0; i < cap; i++) text[i] = i % 64 == 0 ? ';' : i % 64 == 63 ? '\n' : 'c';
    char err[TRAIN_ERROR_SIZE] = "";
    const char *path = write_bytes("cap", text, cap);
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_load(&g_cfg, path, err, sizeof err));
    text[cap] = '\n';
    path = write_bytes("cap", text, cap + 1);
    CU_ASSERT_EQUAL(train_config_load(&g_cfg, path, err, sizeof err), FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    char want[128];
    snprintf(want, sizeof want, "larger than the limit of %d bytes", TRAIN_MAX_CONFIG_BYTES);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("cannot read config", path, want)));
    remove(path);
    free(text);
}

/* Text after the ']' of a section header is an error (it used to be ignored); white space
 * and a comment are not. */
static void test_section_trailing_text(void) {
    load_fails("section_text", "[optim] lr = 0.1\n", 1, FSDP_ERR_CONFIG,
               NEEDLES("text after ']' in the section header", "lr = 0.1"));
    load_fails("section_text2", "[model]\nwidths = 4,4\n[optim]x\n", 3, FSDP_ERR_CONFIG,
               NEEDLES("text after ']'", "'x'"));
    load_fails("section_text3", "  [optim]];\n", 1, FSDP_ERR_CONFIG, NEEDLES("text after ']'"));
    load_ok("section_comment", "  [optim]  ; the optimizer\r\nlr = 0.1\n[train]\t\nsteps = 3\n");
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.lr, 0.1, 1e-12);
    CU_ASSERT_EQUAL(g_cfg.train.steps, 3);
}

/* A line of exactly TRAIN_MAX_LINE characters (the newline not counted; a '\r' is) loads, one
 * more is refused, and the message states that limit; also for a last line without newline. */
static void test_line_limit(void) {
    int value = TRAIN_MAX_LINE - (int)strlen("metrics = ");
    char text[TRAIN_MAX_LINE + 64], want[64];
    snprintf(want, sizeof want, "line is longer than %d characters", TRAIN_MAX_LINE);
    const char *endings[] = {"\n", "", "\r\n"};
    for (int e = 0; e < 3; e++) {
        int v = endings[e][0] == '\r' ? value - 1 : value;
        snprintf(text, sizeof text, "[log]\nmetrics = %0*d%s", v, 0, endings[e]);
        load_ok("line_at_limit", text);
        CU_ASSERT_EQUAL((int)strlen(g_cfg.log.metrics), v);
        snprintf(text, sizeof text, "[log]\nmetrics = %0*d%s", v + 1, 0, endings[e]);
        load_fails("line_over_limit", text, 2, FSDP_ERR_CONFIG, NEEDLES(want));
    }
}

/* A --set value longer than TRAIN_MAX_VALUE characters is refused (it used to be cut to 512
 * bytes, which could leave a different valid value); one of exactly that length is not. */
static void test_set_value_limit(void) {
    static char arg[TRAIN_MAX_VALUE + 64];
    char err[TRAIN_ERROR_SIZE] = "", want[64];
    train_config_init(&g_cfg);
    snprintf(arg, sizeof arg, "log.metrics=%0*d", TRAIN_MAX_VALUE, 0);
    FSDP_TEST_OK(train_config_set(&g_cfg, arg, err, sizeof err));
    CU_ASSERT_EQUAL((int)strlen(g_cfg.log.metrics), TRAIN_MAX_VALUE);
    snprintf(arg, sizeof arg, "optim.lr=0.2%0*d5", TRAIN_MAX_VALUE - 3, 0);
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, arg, err, sizeof err), FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    snprintf(want, sizeof want, "longer than the limit of %d characters", TRAIN_MAX_VALUE);
    CU_ASSERT_TRUE(
        fsdp_test_message_has(err, NEEDLES("--set optim.lr=0.2000", "[optim] lr", want)));
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.lr, 0.2, 1e-12);
}

static void test_missing_file(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    const char *path = FSDP_BINARY_DIR "/test_config_no_such_file.ini";
    remove(path);
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(train_config_load(&g_cfg, path, err, sizeof err), FSDP_ERR_IO);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("cannot open config", path, "No such file or directory")));
    CU_ASSERT_EQUAL(train_config_load(&g_cfg, FSDP_BINARY_DIR, err, sizeof err), FSDP_ERR_IO);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("cannot read config", FSDP_BINARY_DIR)));
}

static void test_set_override(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    const char *path = write_config("set", "[optim]\nlr = 0.1\n");
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_load(&g_cfg, path, err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "optim.lr=0.3", err, sizeof err));
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.lr, 0.3, 1e-12);
    CU_ASSERT_STRING_EQUAL(train_config_origin(&g_cfg, "optim", "lr"), "--set optim.lr=0.3");
    FSDP_TEST_OK(train_config_set(&g_cfg, " model.widths = 8, 8 ", err, sizeof err));
    CU_ASSERT_EQUAL(g_cfg.model.widths.n, 2);
    FSDP_TEST_OK(train_config_set(&g_cfg, "log.metrics=a=b.jsonl", err, sizeof err));
    CU_ASSERT_STRING_EQUAL(g_cfg.log.metrics, "a=b.jsonl");
    /* a value error names the --set argument, the key and the allowed values */
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "optim.lr=abc", err, sizeof err), FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("--set optim.lr=abc: bad value 'abc' for [optim] lr", "a float > 0")));
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.lr, 0.3, 1e-12);
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "optim.foo=1", err, sizeof err), FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(
        fsdp_test_message_has(err, NEEDLES("--set optim.foo=1", "unknown key 'foo'",
                                           "allowed keys: name, lr, momentum, nesterov, betas")));
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "parallel.dp=2", err, sizeof err), FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("--set parallel.dp=2", "unknown key 'dp' in section [parallel]",
                     "allowed keys: backend, ranks, threads_per_rank, tp")));
    remove(path);
}

static void test_bad_set_syntax(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    const char *bad[] = {"optim.lr", "lr=0.1", "=0.1", ""};
    train_config_init(&g_cfg);
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(train_config_set(&g_cfg, bad[i], err, sizeof err), FSDP_ERR_CONFIG);
        char want[64];
        snprintf(want, sizeof want, "bad --set '%s'", bad[i]);
        CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES(want, "expected section.key=value")));
    }
    printf("\n    %s", err);
}

static void test_check(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_set(&g_cfg, "optim.nesterov=true", err, sizeof err));
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "optim.momentum=0", err, sizeof err));
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("[optim] nesterov = true (--set optim.nesterov=true)",
                     "needs [optim] momentum > 0", "(--set optim.momentum=0)")));
}

/* Runs train_cli_parse on a NULL-terminated argument list (argv[0] added). */
static fsdp_status cli(train_cli_action *action, char *err, const char *const *args) {
    char *argv[16] = {"fsdp-train"};
    int argc = 1;
    while (args[argc - 1]) argv[argc] = (char *)args[argc - 1], argc++;
    return train_cli_parse(argc, argv, &g_cfg, action, err, TRAIN_ERROR_SIZE);
}

static void test_cli(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_cli_action action;
    const char *path = write_config("cli", "[optim]\nlr = 0.1\n[train]\nsteps = 7\n");
    /* --set is applied after the file, in order, wherever it stands */
    FSDP_TEST_OK(cli(&action, err,
                     NEEDLES("--set", "optim.lr=0.4", "--config", path, "--set=optim.lr=0.5",
                             "--set", "train.log_every=2")));
    CU_ASSERT_EQUAL(action, TRAIN_CLI_RUN);
    CU_ASSERT_DOUBLE_EQUAL(g_cfg.optim.lr, 0.5, 1e-12);
    CU_ASSERT_EQUAL(g_cfg.train.steps, 7);
    CU_ASSERT_EQUAL(g_cfg.train.log_every, 2);
    FSDP_TEST_OK(cli(&action, err, NEEDLES("--config", path, "--help")));
    CU_ASSERT_EQUAL(action, TRAIN_CLI_HELP);
    FSDP_TEST_OK(cli(&action, err, NEEDLES("--version")));
    CU_ASSERT_EQUAL(action, TRAIN_CLI_VERSION);

    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--set", "optim.lr=1")), FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("missing --config FILE")));
    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--config", path, "--frobnicate")), FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("unknown argument '--frobnicate'")));
    CU_ASSERT_EQUAL(action, TRAIN_CLI_BAD_USAGE);
    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--config", path, "--set")), FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("--set needs a value")));
    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--config", path, "--config", path)),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("--config given twice")));
    /* a forgotten value: the next argument is an option ("--..." or "-h"), refused as a bad
     * command line (before: --plan read as the config file's name); --config=--plan is taken */
    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--config", "--plan")), FSDP_ERR_CONFIG);
    CU_ASSERT_EQUAL(action, TRAIN_CLI_BAD_USAGE);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("--config needs a FILE, got the option '--plan'; to name a file that starts "
                     "with '-', write ./--plan")));
    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--set", "--config", path)), FSDP_ERR_CONFIG);
    CU_ASSERT_EQUAL(action, TRAIN_CLI_BAD_USAGE);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("--set needs section.key=value, got the option '--config'")));
    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--config", path, "--set", "--json", "--plan")),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_EQUAL(action, TRAIN_CLI_BAD_USAGE);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("--set needs", "got the option '--json'")));
    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--config=--plan")), FSDP_ERR_IO);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("cannot open config '--plan'")));
    FSDP_TEST_OK(cli(&action, err, NEEDLES("--config", "-h"))); /* -h anywhere: the help */
    CU_ASSERT_EQUAL(action, TRAIN_CLI_HELP);
    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--config", path, "--set", "optim.lr=-1")),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("--set optim.lr=-1", "a float > 0")));
    CU_ASSERT_NOT_EQUAL(action, TRAIN_CLI_BAD_USAGE); /* the config's error: no usage */
    CU_ASSERT_EQUAL(
        cli(&action, err,
            NEEDLES("--config", path, "--set", "optim.momentum=0", "--set", "optim.nesterov=on")),
        FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("needs [optim] momentum > 0")));
    remove(path);
    CU_ASSERT_EQUAL(cli(&action, err, NEEDLES("--config", path)), FSDP_ERR_IO);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, NEEDLES("cannot open config", path)));
}

/* Reads a whole stream that was written to (rewinds it first). */
static void slurp(FILE *f, char *buf, size_t size) {
    rewind(f);
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
}

/* --help and train_config_write come from the same table: every written key is in the help,
 * with its default, and the written file loads back to the same values. */
static void test_help_and_write(void) {
    static char help[32768], written[16384], again[16384];
    char err[TRAIN_ERROR_SIZE] = "";
    FILE *f = tmpfile();
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    train_config_print_help(f);
    slurp(f, help, sizeof help);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(help, "usage: fsdp-train --config FILE"));
    CU_ASSERT_PTR_NOT_NULL(strstr(help, "--set section.key=value"));
    char limits[256]; /* the limits the parser enforces (see line_limit, size_cap, ...) */
    snprintf(limits, sizeof limits,
             "at most %d bytes,\nwithout NUL bytes, of lines of at most %d characters",
             TRAIN_MAX_CONFIG_BYTES, TRAIN_MAX_LINE);
    CU_ASSERT_PTR_NOT_NULL(strstr(help, limits));
    snprintf(limits, sizeof limits, "a --set value has at most %d characters", TRAIN_MAX_VALUE);
    CU_ASSERT_PTR_NOT_NULL(strstr(help, limits));

    train_config_init(&g_cfg);
    f = tmpfile();
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    train_config_write(&g_cfg, f);
    slurp(f, written, sizeof written);
    fclose(f);
    int keys = 0;
    for (char *line = strtok(written, "\n"); line; line = strtok(NULL, "\n")) {
        char entry[256], *comment = strstr(line, "  ; ");
        if (comment) *comment = '\0';
        if (line[0] == '[')
            snprintf(entry, sizeof entry, "\n%s: ", line);
        else if (line[strlen(line) - 1] == ' ')
            snprintf(entry, sizeof entry, "  %s (", line);
        else
            snprintf(entry, sizeof entry, "  %s  (", line), keys++;
        if (!strstr(help, entry)) fprintf(stderr, "\n  --help lacks \"%s\"", entry);
        CU_ASSERT_PTR_NOT_NULL(strstr(help, entry));
    }
    /* every key but the empty-by-default model.tp_plan, model.checkpoint_activations, data.path,
     * optim.no_decay, checkpoint.dir, log.metrics */
    CU_ASSERT_EQUAL(keys, 76); /* 65, llama's five rope_scaling keys, tie_embeddings, autocast,
                                * device, comm_thread, allow_tf32, peak_tflops */

    /* round trip through a file, with values different from the defaults */
    FSDP_TEST_OK(train_config_set(&g_cfg, "model.widths=3,5,7", err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "optim.lr=0.125", err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "data.teacher_widths=", err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "log.level=warn", err, sizeof err));
    char path[1024];
    snprintf(path, sizeof path, "%s/test_config_written.ini", FSDP_BINARY_DIR);
    f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    train_config_write(&g_cfg, f);
    fclose(f);
    static train_config loaded;
    train_config_init(&loaded);
    FSDP_TEST_OK(train_config_load(&loaded, path, err, sizeof err));
    CU_ASSERT_EQUAL(loaded.model.widths.n, 3);
    CU_ASSERT_EQUAL(loaded.model.widths.v[2], 7);
    CU_ASSERT_EQUAL(loaded.optim.lr, 0.125);
    CU_ASSERT_EQUAL(loaded.data.teacher_widths.n, 0);
    CU_ASSERT_EQUAL(loaded.log.level, FSDP_LOG_WARN);
    f = tmpfile();
    train_config_write(&loaded, f);
    slurp(f, again, sizeof again);
    fclose(f);
    f = tmpfile();
    train_config_write(&g_cfg, f);
    slurp(f, written, sizeof written);
    fclose(f);
    /* the same lines up to the origin comments */
    char *a = written, *b = again;
    while (*a && *b) {
        size_t la = strcspn(a, ";\n"), lb = strcspn(b, ";\n");
        CU_ASSERT_TRUE(la == lb && strncmp(a, b, la) == 0);
        a = strchr(a, '\n'), b = strchr(b, '\n');
        if (!a || !b) break;
        a++, b++;
    }
    CU_ASSERT_TRUE(a && b && *a == *b);
    remove(path);
}

/* [checkpoint] and [model] init: defaults, values, and the comparison with a configuration
 * saved as text (a checkpoint's): a key that differs is named with both values and origins;
 * keys of other sections, the excepted ones and a key missing from the text at its default
 * value pass. */
static void test_checkpoint_keys(void) {
    char err[TRAIN_ERROR_SIZE] = "", value[64];
    train_config_init(&g_cfg);
    CU_ASSERT_STRING_EQUAL(g_cfg.model.init, "random");
    CU_ASSERT_STRING_EQUAL(g_cfg.checkpoint.dir, "");
    CU_ASSERT_EQUAL(g_cfg.checkpoint.every, 0);
    CU_ASSERT_EQUAL(g_cfg.checkpoint.keep, 0);
    CU_ASSERT_STRING_EQUAL(g_cfg.checkpoint.resume, "auto");
    CU_ASSERT_FALSE(g_cfg.checkpoint.async);
    load_ok("ckpt", "[model]\ninit = w.safetensors\n[checkpoint]\ndir = runs/a\nevery = 100\n"
                    "keep = 3\nresume = none\nasync = true\n");
    CU_ASSERT_STRING_EQUAL(g_cfg.model.init, "w.safetensors");
    CU_ASSERT_STRING_EQUAL(g_cfg.checkpoint.dir, "runs/a");
    CU_ASSERT_EQUAL(g_cfg.checkpoint.every, 100);
    CU_ASSERT_EQUAL(g_cfg.checkpoint.keep, 3);
    CU_ASSERT_STRING_EQUAL(g_cfg.checkpoint.resume, "none");
    CU_ASSERT_TRUE(g_cfg.checkpoint.async);
    load_fails("ckpt_every", "[checkpoint]\nevery = -1\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[checkpoint] every", "expected an integer >= 0"));
    load_fails("ckpt_unknown", "[checkpoint]\nfolder = x\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("allowed keys: dir, every, keep, resume, async"));

    /* the saved text of one configuration, compared with another */
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_set(&g_cfg, "optim.lr=0.1", err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "data.teacher_widths=", err, sizeof err));
    char *saved = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&saved, &size);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    train_config_write(&g_cfg, f);
    fclose(f);
    CU_ASSERT_TRUE(train_config_saved_value(saved, "optim", "lr", value, sizeof value));
    CU_ASSERT_STRING_EQUAL(value, "0.1");
    CU_ASSERT_TRUE(train_config_saved_value(saved, "data", "teacher_widths", value, sizeof value));
    CU_ASSERT_STRING_EQUAL(value, "");
    CU_ASSERT_FALSE(train_config_saved_value(saved, "optim", "nope", value, sizeof value));
    const char *const sections[] = {"model", "data", "optim", NULL};
    const char *const except[] = {"model.init", NULL};
    /* the same values from elsewhere, other sections and the excepted key may differ */
    FSDP_TEST_OK(train_config_set(&g_cfg, "parallel.tp=2", err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "model.init=x.h5", err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "optim.lr=0.100", err, sizeof err));
    FSDP_TEST_OK(train_config_compare_saved(&g_cfg, saved, sections, except, err, sizeof err));
    CU_ASSERT_EQUAL(train_config_compare_saved(&g_cfg, saved, sections, NULL, err, sizeof err),
                    FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("[model] init = x.h5 (--set model.init=x.h5) here, but random (default) in "
                     "the saved configuration")));
    FSDP_TEST_OK(train_config_set(&g_cfg, "data.batch_size=32", err, sizeof err));
    CU_ASSERT_EQUAL(train_config_compare_saved(&g_cfg, saved, sections, except, err, sizeof err),
                    FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("[data] batch_size = 32 (--set data.batch_size=32) here, but 64 (default)")));
    /* a key the saved text lacks counts as its default */
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_compare_saved(&g_cfg, "[optim]\nlr = 0.2  ; default\n", sections,
                                            except, err, sizeof err));
    FSDP_TEST_OK(train_config_set(&g_cfg, "optim.momentum=0.5", err, sizeof err));
    CU_ASSERT_EQUAL(train_config_compare_saved(&g_cfg, "[optim]\nlr = 0.2  ; default\n", sections,
                                               except, err, sizeof err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_TRUE(fsdp_test_message_has(
        err, NEEDLES("[optim] momentum = 0.5", "0.9 (default, not in the saved configuration)")));
    free(saved);
}

/* Fails train_config_check after the --set assignments (on the defaults) with the needles. */
static void check_fails(const char *const *sets, const char *const *needles) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    for (int i = 0; sets[i]; i++) FSDP_TEST_OK(train_config_set(&g_cfg, sets[i], err, sizeof err));
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    CU_ASSERT_TRUE(fsdp_test_message_has(err, needles));
}

static void check_ok(const char *const *sets) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    for (int i = 0; sets[i]; i++) FSDP_TEST_OK(train_config_set(&g_cfg, sets[i], err, sizeof err));
    fsdp_status st = train_config_check(&g_cfg, err, sizeof err);
    if (st != FSDP_OK) printf("\n    %s", err);
    CU_ASSERT_EQUAL(st, FSDP_OK);
}

/* [data], [optim] and [train] eval_every: defaults, values, every error with file and line,
 * and the rules that join keys. */
static void test_data_optim_keys(void) {
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(g_cfg.data.kind, TRAIN_DATA_SYNTHETIC);
    CU_ASSERT_STRING_EQUAL(g_cfg.data.path, "");
    CU_ASSERT_STRING_EQUAL(g_cfg.data.x, "x");
    CU_ASSERT_STRING_EQUAL(g_cfg.data.y, "y");
    CU_ASSERT_EQUAL(g_cfg.data.task, TRAIN_TASK_REGRESSION);
    CU_ASSERT_EQUAL(g_cfg.data.eval_fraction, 0.0);
    CU_ASSERT_FALSE(g_cfg.data.shuffle);
    CU_ASSERT_EQUAL(g_cfg.optim.name, TRAIN_OPTIM_SGD);
    CU_ASSERT_EQUAL(g_cfg.optim.betas.n, 2);
    CU_ASSERT_EQUAL(g_cfg.optim.betas.v[0], 0.9);
    CU_ASSERT_EQUAL(g_cfg.optim.betas.v[1], 0.999);
    CU_ASSERT_EQUAL(g_cfg.optim.eps, 1e-8);
    CU_ASSERT_STRING_EQUAL(g_cfg.optim.no_decay, "");
    CU_ASSERT_EQUAL(g_cfg.optim.clip_grad_norm, 0.0);
    CU_ASSERT_EQUAL(g_cfg.optim.schedule, TRAIN_SCHEDULE_CONSTANT);
    CU_ASSERT_EQUAL(g_cfg.optim.warmup_steps, 0);
    CU_ASSERT_EQUAL(g_cfg.optim.min_lr, 0.0);
    CU_ASSERT_EQUAL(g_cfg.train.eval_every, 0);

    load_ok("data_optim", "[model]\nwidths = 64,32,10\n"
                          "[parallel]\nuse_orig_params = true\n"
                          "[data]\nkind = h5\npath = d.h5\nx = images\ny = labels\n"
                          "task = classification\neval_fraction = 0.25\nshuffle = yes\n"
                          "[optim]\nname = adamw\nlr = 0.003\nbetas = 0.8, 0.95\neps = 1e-6\n"
                          "weight_decay = 0.1\nno_decay = *.bias, 0.weight\n"
                          "clip_grad_norm = 1.5\nschedule = cosine\nwarmup_steps = 10\n"
                          "min_lr = 1e-5\n[train]\nsteps = 100\neval_every = 20\n");
    CU_ASSERT_EQUAL(g_cfg.data.kind, TRAIN_DATA_H5);
    CU_ASSERT_STRING_EQUAL(g_cfg.data.path, "d.h5");
    CU_ASSERT_STRING_EQUAL(g_cfg.data.x, "images");
    CU_ASSERT_STRING_EQUAL(g_cfg.data.y, "labels");
    CU_ASSERT_EQUAL(g_cfg.data.task, TRAIN_TASK_CLASSIFICATION);
    CU_ASSERT_EQUAL(g_cfg.data.eval_fraction, 0.25);
    CU_ASSERT_TRUE(g_cfg.data.shuffle);
    CU_ASSERT_EQUAL(g_cfg.optim.name, TRAIN_OPTIM_ADAMW);
    CU_ASSERT_EQUAL(g_cfg.optim.betas.v[0], 0.8);
    CU_ASSERT_EQUAL(g_cfg.optim.betas.v[1], 0.95);
    CU_ASSERT_EQUAL(g_cfg.optim.eps, 1e-6);
    CU_ASSERT_EQUAL(g_cfg.optim.clip_grad_norm, 1.5);
    CU_ASSERT_EQUAL(g_cfg.optim.schedule, TRAIN_SCHEDULE_COSINE);
    CU_ASSERT_EQUAL(g_cfg.optim.warmup_steps, 10);
    CU_ASSERT_EQUAL(g_cfg.optim.min_lr, 1e-5);
    CU_ASSERT_EQUAL(g_cfg.train.eval_every, 20);
    char err[TRAIN_ERROR_SIZE] = "", patterns[TRAIN_MAX_NO_DECAY][TRAIN_MAX_STRING];
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
    CU_ASSERT_EQUAL(train_config_no_decay(&g_cfg, patterns), 2);
    CU_ASSERT_STRING_EQUAL(patterns[0], "*.bias");
    CU_ASSERT_STRING_EQUAL(patterns[1], "0.weight");

    /* wrong type, out of range, unknown value: the file, the line, the allowed values */
    load_fails("kind", "[data]\n\nkind = csv\n", 3, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'csv' for [data] kind", "one of synthetic, h5"));
    load_fails("task", "[data]\ntask = ranking\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[data] task", "one of regression, classification"));
    load_fails("eval_fraction", "[data]\neval_fraction = 1\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[data] eval_fraction", "out of range", "a float >= 0 and < 1"));
    load_fails("eval_fraction_type", "[data]\neval_fraction = half\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'half' for [data] eval_fraction", "a float >= 0 and < 1"));
    load_fails("shuffle", "[data]\nshuffle = sometimes\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[data] shuffle", "true or false"));
    load_fails("name", "[optim]\nname = lamb\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'lamb' for [optim] name", "one of sgd, adam, adamw"));
    load_fails("betas_one", "[optim]\nbetas = 0.9\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[optim] betas", "1 entry", "2 comma-separated floats, each >= 0 and < 1"));
    load_fails("betas_range", "[optim]\nbetas = 0.9,1.0\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[optim] betas", "entry 2 '1.0' is out of range"));
    load_fails("betas_text", "[optim]\nbetas = 0.9,high\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[optim] betas", "entry 2 'high' is not a number"));
    load_fails("betas_three", "[optim]\nbetas = 0.9,0.99,0.999\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[optim] betas", "more than 2 entries"));
    load_fails("eps", "[optim]\neps = 0\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[optim] eps", "a float > 0 and <= 1"));
    load_fails("clip", "[optim]\nclip_grad_norm = -1\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[optim] clip_grad_norm", "a float >= 0"));
    load_fails("schedule", "[optim]\nschedule = step\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'step' for [optim] schedule", "one of constant, warmup, cosine"));
    load_fails("warmup", "[optim]\nwarmup_steps = 1.5\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[optim] warmup_steps", "an integer >= 0"));
    load_fails("min_lr", "[optim]\nmin_lr = -0.1\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[optim] min_lr", "a float >= 0"));
    load_fails("eval_every", "[train]\neval_every = -5\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[train] eval_every", "an integer >= 0"));
    load_fails("data_unknown", "[data]\nfile = a.h5\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("unknown key 'file' in section [data]",
                       "allowed keys: kind, path, x, y, task, eval_fraction, shuffle"));

    /* rules that join keys: the keys, their origins and the fix */
    check_fails(SET("data.kind=h5"), NEEDLES("[data] kind = h5", "needs [data] path"));
    check_fails(SET("data.kind=h5", "data.path=a.h5", "data.samples=10"),
                NEEDLES("[data] samples = 10 (--set data.samples=10) applies to kind = synthetic",
                        "[data] kind = h5"));
    check_fails(SET("data.path=a.h5"), NEEDLES("[data] path = a.h5", "applies to kind = h5"));
    check_fails(SET("data.task=classification", "model.widths=4,8,1"),
                NEEDLES("[data] task = classification", "output width of at least 2"));
    check_fails(SET("data.task=classification", "data.noise=0.1"),
                NEEDLES("[data] noise = 0.1", "applies to task = regression"));
    check_fails(SET("data.eval_fraction=0.0001"),
                NEEDLES("[data] eval_fraction = 0.0001", "holds out 0 of the 4096 samples"));
    check_fails(SET("train.eval_every=10"),
                NEEDLES("[train] eval_every = 10", "holds out nothing", "eval_fraction"));
    check_fails(SET("optim.name=adam", "optim.momentum=0.5"),
                NEEDLES("[optim] momentum = 0.5", "applies to name = sgd", "[optim] name = adam"));
    check_fails(SET("optim.betas=0.8,0.9"),
                NEEDLES("[optim] betas = 0.8,0.9", "applies to name = adam or adamw"));
    check_fails(SET("optim.warmup_steps=10"),
                NEEDLES("[optim] warmup_steps = 10", "applies to schedule = warmup or cosine"));
    check_fails(SET("optim.schedule=warmup", "optim.min_lr=0.01"),
                NEEDLES("[optim] min_lr = 0.01", "applies to schedule = cosine"));
    check_fails(SET("optim.schedule=cosine", "optim.warmup_steps=100", "train.steps=100"),
                NEEDLES("[optim] warmup_steps = 100", "must be below [train] steps = 100"));
    check_fails(SET("optim.schedule=cosine", "optim.min_lr=1"),
                NEEDLES("[optim] min_lr = 1", "is above [optim] lr = 0.2"));
    check_fails(SET("optim.no_decay=*.bias"),
                NEEDLES("[optim] no_decay = *.bias", "use_orig_params = true"));
    check_fails(SET("optim.no_decay=*.bias,,x", "parallel.use_orig_params=true"),
                NEEDLES("[optim] no_decay", "non-empty patterns"));
    check_ok(SET("optim.no_decay=*.bias", "parallel.mode=replicate"));
    check_ok(SET("optim.name=adam", "optim.betas=0,0.5", "optim.schedule=warmup",
                 "optim.warmup_steps=10000"));
    check_ok(SET("data.task=classification", "data.eval_fraction=0.1", "train.eval_every=5",
                 "data.shuffle=true"));
}

/* [model] norm, tp_plan, checkpoint_activations, [train] grad_accum, [log] comm_debug and
 * progress: defaults, values from a file, wrong types and values with file and line, and the
 * checks against the model's module names and the batch. */
static void test_model_train_log_keys(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(g_cfg.model.norm, TRAIN_NORM_NONE);
    CU_ASSERT_STRING_EQUAL(g_cfg.model.tp_plan, "");
    CU_ASSERT_STRING_EQUAL(g_cfg.model.checkpoint_activations, "");
    CU_ASSERT_EQUAL(g_cfg.train.grad_accum, 1);
    CU_ASSERT_FALSE(g_cfg.log.comm_debug);
    CU_ASSERT_EQUAL(g_cfg.log.progress, TRAIN_PROGRESS_AUTO);
    load_ok("model_keys", "[model]\nnorm = rmsnorm\ntp_plan = 1=colwise, 3 = rowwise\n"
                          "checkpoint_activations = 0, [13]\n[parallel]\ntp = 2\n"
                          "[train]\ngrad_accum = 4\n[log]\ncomm_debug = yes\nprogress = bar\n");
    CU_ASSERT_EQUAL(g_cfg.model.norm, TRAIN_NORM_RMSNORM);
    CU_ASSERT_STRING_EQUAL(g_cfg.model.tp_plan, "1=colwise, 3 = rowwise");
    CU_ASSERT_EQUAL(g_cfg.train.grad_accum, 4);
    CU_ASSERT_TRUE(g_cfg.log.comm_debug);
    CU_ASSERT_EQUAL(g_cfg.log.progress, TRAIN_PROGRESS_BAR);
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
    /* the modules: RMSNorm, then the MLP's, names shifted by one */
    train_module_info m[TRAIN_MAX_MODULES];
    CU_ASSERT_EQUAL(train_config_modules(&g_cfg, m), 6);
    CU_ASSERT_TRUE(strcmp(m[0].name, "0") == 0 && strcmp(m[0].kind, "RMSNorm") == 0 &&
                   m[0].linear == -1);
    CU_ASSERT_TRUE(strcmp(m[3].name, "3") == 0 && strcmp(m[3].kind, "Linear") == 0 &&
                   m[3].linear == 1);
    CU_ASSERT_TRUE(strcmp(m[4].kind, "ReLU") == 0 && strcmp(m[5].name, "5") == 0 &&
                   m[5].linear == 2);
    train_tp_style styles[TRAIN_MAX_LIST];
    FSDP_TEST_OK(train_config_tp_plan(&g_cfg, styles, err, sizeof err));
    CU_ASSERT_TRUE(styles[0] == TRAIN_TP_COLWISE && styles[1] == TRAIN_TP_ROWWISE &&
                   styles[2] == TRAIN_TP_NONE);
    char patterns[TRAIN_MAX_ACT_PATTERNS][TRAIN_MAX_STRING];
    CU_ASSERT_EQUAL(train_config_checkpoint_patterns(&g_cfg, patterns), 2);
    CU_ASSERT_STRING_EQUAL(patterns[1], "[13]");
    /* the default plan: Megatron pairs, the odd last Linear whole */
    train_config_init(&g_cfg);
    FSDP_TEST_OK(train_config_tp_plan(&g_cfg, styles, err, sizeof err));
    CU_ASSERT_TRUE(styles[0] == TRAIN_TP_COLWISE && styles[1] == TRAIN_TP_ROWWISE &&
                   styles[2] == TRAIN_TP_NONE);

    /* wrong types and values, with file and line */
    load_fails("norm", "[model]\nnorm = layernorm\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'layernorm' for [model] norm", "one of none, rmsnorm"));
    load_fails("grad_accum_zero", "[train]\ngrad_accum = 0\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("[train] grad_accum", "out of range", "an integer in [1, 1048576]"));
    load_fails("grad_accum_text", "[train]\ngrad_accum = two\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'two' for [train] grad_accum", "expected an integer"));
    load_fails("comm_debug", "[log]\ncomm_debug = maybe\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'maybe' for [log] comm_debug", "true or false"));
    load_fails("progress", "[log]\nprogress = fancy\n", 2, FSDP_ERR_CONFIG,
               NEEDLES("bad value 'fancy' for [log] progress", "one of auto, bar, lines"));

    /* tp_plan against the model's names (0 Linear, 1 ReLU, 2 Linear, 3 ReLU, 4 Linear) */
    check_fails(SET("parallel.tp=2", "model.tp_plan=9=colwise,2=rowwise"),
                NEEDLES("[model] tp_plan = 9=colwise,2=rowwise (--set "
                        "model.tp_plan=9=colwise,2=rowwise)",
                        "entry 1: '9' matches no module of the model; its modules are 0 (Linear), "
                        "1 (ReLU), 2 (Linear), 3 (ReLU), 4 (Linear)"));
    check_fails(SET("parallel.tp=2", "model.tp_plan=0"),
                NEEDLES("entry 1 '0' is not name=style", "0=colwise,2=rowwise"));
    check_fails(SET("parallel.tp=2", "model.tp_plan=0=columnwise"),
                NEEDLES("unknown style 'columnwise'; use colwise or rowwise"));
    check_fails(
        SET("parallel.tp=2", "model.tp_plan=0=colwise,1=rowwise"),
        NEEDLES("entry 2 '1=rowwise' names module 1, a ReLU", "a style applies to a Linear layer"));
    check_fails(SET("parallel.tp=2", "model.tp_plan=0=colwise,[02]=rowwise"),
                NEEDLES("module 0 gets a style from entry 1 and from entry 2"));
    check_fails(SET("parallel.tp=2", "model.tp_plan=2=rowwise"),
                NEEDLES("module 2 (Linear 1) is rowwise, but its input is not sharded",
                        "make module 0 colwise"));
    check_fails(SET("parallel.tp=2", "model.tp_plan=0=colwise"),
                NEEDLES("module 2 (Linear 1) is not in the plan, but its input is sharded over tp "
                        "by the colwise module 0 before it: make module 2 rowwise"));
    check_fails(SET("parallel.tp=2", "model.tp_plan=0=colwise,2=rowwise,4=colwise"),
                NEEDLES("module 4, the last Linear, is colwise"));
    check_fails(SET("model.tp_plan=0=colwise,2=rowwise"),
                NEEDLES("[model] tp_plan = 0=colwise,2=rowwise", "applies to tp > 1",
                        "[parallel] tp = 1 (default)"));
    check_fails(SET("parallel.tp=3", "model.widths=8,12,16,4", "model.tp_plan=2=colwise,4=rowwise"),
                NEEDLES("[parallel] tp = 3", "must divide the hidden width 16",
                        "Linear 1 (Colwise) and Linear 2 (Rowwise)"));
    check_ok(SET("parallel.tp=3", "model.widths=8,12,16,4", "model.tp_plan=0=colwise,2=rowwise"));
    check_ok(SET("parallel.tp=2", "model.tp_plan=*[0]=colwise, *[2]=rowwise"));

    /* checkpoint_activations: every pattern matches a module */
    check_fails(SET("model.checkpoint_activations=0,7"),
                NEEDLES("[model] checkpoint_activations = 0,7",
                        "pattern '7' matches no module of the model; its modules are 0 (Linear)"));
    check_fails(SET("model.checkpoint_activations=0,,2"),
                NEEDLES("up to 8 comma-separated non-empty module name patterns"));
    check_fails(SET("model.norm=rmsnorm", "model.checkpoint_activations=5,6"),
                NEEDLES("pattern '6' matches no module",
                        "its modules are 0 (RMSNorm), 1 (Linear), 2 (ReLU), 3 (Linear), 4 "
                        "(ReLU), 5 (Linear)"));
    check_ok(SET("model.checkpoint_activations=*"));

    /* grad_accum divides the batch, and each micro-batch has a sample per dp rank */
    check_fails(SET("train.grad_accum=3"),
                NEEDLES("[train] grad_accum = 3 (--set train.grad_accum=3) does not divide [data] "
                        "batch_size = 64 (default)",
                        "use a divisor of 64"));
    check_fails(SET("parallel.backend=local", "parallel.ranks=4", "train.grad_accum=32"),
                NEEDLES("[data] batch_size = 64 (default) split into [train] grad_accum = 32",
                        "micro-batches of 2 samples is smaller than the 4 data-parallel ranks",
                        "at least 128"));
    check_ok(SET("parallel.backend=local", "parallel.ranks=4", "train.grad_accum=16"));

    /* the local backend's limit on rank threads, named at config time */
    check_fails(SET("parallel.backend=local", "parallel.ranks=1025"),
                NEEDLES("[parallel] ranks = 1025 (--set parallel.ranks=1025) asks for 1025 rank "
                        "threads, but the local backend runs at most 1024",
                        "backend = mpi"));
    check_fails(SET("parallel.backend=local", "parallel.tp=2048", "model.widths=8,2048,8"),
                NEEDLES("[parallel] tp = 2048", "asks for 2048 rank threads"));
    check_ok(SET("parallel.backend=local", "parallel.ranks=1024", "data.batch_size=1024"));
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"defaults", test_defaults},
        {"good_file", test_good_file},
        {"unknown_key", test_unknown_key},
        {"unknown_section", test_unknown_section},
        {"bad_int", test_bad_int},
        {"out_of_range", test_out_of_range},
        {"bad_enum", test_bad_enum},
        {"bad_list", test_bad_list},
        {"file_structure_errors", test_file_structure_errors},
        {"float_overflow", test_float_overflow},
        {"nul_bytes", test_nul_bytes},
        {"special_files", test_special_files},
        {"size_cap", test_size_cap},
        {"section_trailing_text", test_section_trailing_text},
        {"line_limit", test_line_limit},
        {"set_value_limit", test_set_value_limit},
        {"missing_file", test_missing_file},
        {"set_override", test_set_override},
        {"bad_set_syntax", test_bad_set_syntax},
        {"check", test_check},
        {"cli", test_cli},
        {"help_and_write", test_help_and_write},
        {"checkpoint_keys", test_checkpoint_keys},
        {"data_optim_keys", test_data_optim_keys},
        {"model_train_log_keys", test_model_train_log_keys},
    };
    return fsdp_test_run(argc, argv, "config", cases, (int)(sizeof cases / sizeof cases[0]));
}
