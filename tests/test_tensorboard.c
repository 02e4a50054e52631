/* test_tensorboard.c: tools/train_tensorboard.c's event files read back in C: CRC-32C against
 * RFC 3720's test vectors; every record's framing (length, masked CRC of the length, data,
 * masked CRC of the data) checked and each Event decoded by a protobuf reader written here
 * (first record file_version "brain.Event:2", then the scalars: tag, step, float value bit for
 * bit, wall time); a flipped byte is caught by the CRC; the file name; directories made,
 * unwritable places and bad tags refused with their message. fsdp-train's [log] tensorboard:
 * a run's events have the tags, steps and values (as float32) of its metrics file's records,
 * and a directory that cannot be made is refused before training with the key named.
 * tools/check_tensorboard.py reads the same kind of file with TensorBoard itself. */
#define _POSIX_C_SOURCE 200809L // mkdtemp, popen

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_common.h" // defines: ckpt_test_remove_tree
#include "harness.h"
#include "train_config.h" // defines: train_config_init, train_config_set
#include "train_tensorboard.h"
#include "trainer.h" // defines: train_run

/* expr returns FSDP_OK; else prints msg (the writer's or tb_open's message). */
#define TB_OK(expr, msg)                                                                           \
    do {                                                                                           \
        fsdp_status st_ = (expr);                                                                  \
        if (st_ != FSDP_OK) printf("\n    %s: %s", #expr, (msg));                                  \
        CU_ASSERT_EQUAL(st_, FSDP_OK);                                                             \
    } while (0)

static char *g_root;

static const char *scratch(const char *name) {
    static char bufs[4][1100];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", g_root, name);
    return b;
}

/* ---- an independent reader --------------------------------------------------------------- */

typedef struct event {
    double wall_time;
    int64_t step;
    char file_version[64];
    char tag[300];
    float value;
    int has_value, n_values;
} event;

static uint64_t rd_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static bool rd_varint(const unsigned char **p, const unsigned char *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; *p < end && shift < 70; shift += 7) {
        unsigned char c = *(*p)++;
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return true;
    }
    return false;
}

/* Decodes the fields of a message in [p, end): calls `on` for each (field, wire, value or
 * bytes). Unknown wire types fail. */
typedef bool (*field_fn)(void *ctx, int field, int wire, uint64_t v, const unsigned char *b,
                         size_t n);

static bool decode(const unsigned char *p, const unsigned char *end, field_fn on, void *ctx) {
    while (p < end) {
        uint64_t key, v = 0;
        if (!rd_varint(&p, end, &key)) return false;
        int field = (int)(key >> 3), wire = (int)(key & 7);
        const unsigned char *b = NULL;
        size_t n = 0;
        if (wire == 0) {
            if (!rd_varint(&p, end, &v)) return false;
        } else if (wire == 1 || wire == 5) {
            int k = wire == 1 ? 8 : 4;
            if (end - p < k) return false;
            v = rd_le(p, k);
            p += k;
        } else if (wire == 2) {
            if (!rd_varint(&p, end, &v) || v > (uint64_t)(end - p)) return false;
            b = p, n = (size_t)v;
            p += n;
        } else
            return false;
        if (!on(ctx, field, wire, v, b, n)) return false;
    }
    return true;
}

static bool on_value(void *ctx, int field, int wire, uint64_t v, const unsigned char *b, size_t n) {
    event *e = ctx;
    if (field == 1 && wire == 2 && n < sizeof e->tag) {
        memcpy(e->tag, b, n);
        e->tag[n] = '\0';
        return true;
    }
    if (field == 2 && wire == 5) {
        uint32_t bits = (uint32_t)v;
        memcpy(&e->value, &bits, 4);
        e->has_value = 1;
        return true;
    }
    return false;
}

static bool on_summary(void *ctx, int field, int wire, uint64_t v, const unsigned char *b,
                       size_t n) {
    (void)v;
    event *e = ctx;
    e->n_values++;
    return field == 1 && wire == 2 && decode(b, b + n, on_value, ctx);
}

static bool on_event(void *ctx, int field, int wire, uint64_t v, const unsigned char *b, size_t n) {
    event *e = ctx;
    if (field == 1 && wire == 1) return memcpy(&e->wall_time, &v, 8), true;
    if (field == 2 && wire == 0) return e->step = (int64_t)v, true;
    if (field == 3 && wire == 2 && n < sizeof e->file_version) {
        memcpy(e->file_version, b, n);
        e->file_version[n] = '\0';
        return true;
    }
    if (field == 5 && wire == 2) return decode(b, b + n, on_summary, ctx);
    return false;
}

/* Reads every record of path into ev (at most max); -1 with a reason printed when the framing,
 * a CRC or a message is wrong. */
static int read_events(const char *path, event *ev, int max) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static unsigned char buf[1 << 16];
    size_t size = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t at = 0;
    int n = 0;
    while (at < size) {
        if (size - at < 12 || n == max) return printf("\n    record %d: cut short", n), -1;
        uint64_t len = rd_le(buf + at, 8);
        if ((uint32_t)rd_le(buf + at + 8, 4) != tb_masked_crc(buf + at, 8))
            return printf("\n    record %d: the length's CRC is wrong", n), -1;
        if (len > size - at - 16) return printf("\n    record %d: longer than the file", n), -1;
        const unsigned char *data = buf + at + 12;
        if ((uint32_t)rd_le(data + len, 4) != tb_masked_crc(data, len))
            return printf("\n    record %d: the data's CRC is wrong", n), -1;
        memset(&ev[n], 0, sizeof ev[n]);
        if (!decode(data, data + len, on_event, &ev[n]))
            return printf("\n    record %d: the Event does not decode", n), -1;
        at += 16 + len;
        n++;
    }
    return n;
}

/* ---- cases ------------------------------------------------------------------------------- */

/* RFC 3720 B.4's CRC-32C test vectors, the classic "123456789", and the mask. */
static void test_crc(void) {
    unsigned char zeros[32] = {0}, ones[32], inc[32];
    memset(ones, 0xff, sizeof ones);
    for (int i = 0; i < 32; i++) inc[i] = (unsigned char)i;
    CU_ASSERT_EQUAL(tb_crc32c(zeros, 32), 0x8a9136aau);
    CU_ASSERT_EQUAL(tb_crc32c(ones, 32), 0x62a8ab43u);
    CU_ASSERT_EQUAL(tb_crc32c(inc, 32), 0x46dd794eu);
    CU_ASSERT_EQUAL(tb_crc32c("123456789", 9), 0xe3069283u);
    uint32_t c = 0xe3069283u;
    CU_ASSERT_EQUAL(tb_masked_crc("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

static void test_write_read(void) {
    char err[512] = "";
    tb_writer *w = NULL;
    time_t before = time(NULL);
    TB_OK(tb_open(scratch("runs/a/tb"), &w, err, sizeof err), err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    /* the name: events.out.tfevents.<10 digits>.<host> */
    const char *base = strrchr(tb_path(w), '/') + 1;
    char host[256] = "";
    gethostname(host, sizeof host);
    long long secs = 0;
    char rest[300] = "";
    CU_ASSERT_EQUAL(sscanf(base, "events.out.tfevents.%10lld.%299s", &secs, rest), 2);
    CU_ASSERT_TRUE(secs >= (long long)before && secs <= (long long)time(NULL));
    CU_ASSERT_STRING_EQUAL(rest, host);
    static const char *const tags[] = {"train/loss", "lr", "eval/loss"};
    static const int64_t steps[] = {1, 2, 0, -3, INT64_MAX, 1000000};
    static const double values[] = {2.5, 1.0 / 3.0, -0.0, 1e-30, 3e38, 123456.789};
    for (int i = 0; i < 6; i++)
        TB_OK(tb_scalar_at(w, tags[i % 3], steps[i], values[i], 1.7e9 + i * 0.25),
              tb_last_error(w));
    TB_OK(tb_scalar(w, "nan", 7, NAN), tb_last_error(w));
    char longest[TB_MAX_TAG + 2];
    memset(longest, 'x', sizeof longest);
    longest[TB_MAX_TAG] = '\0';
    TB_OK(tb_scalar_at(w, longest, 8, 1.0, 1.0), tb_last_error(w));
    longest[TB_MAX_TAG] = 'x', longest[TB_MAX_TAG + 1] = '\0';
    CU_ASSERT_EQUAL(tb_scalar(w, longest, 9, 1.0), FSDP_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(tb_last_error(w), "1 to 256 bytes; got 257"));
    CU_ASSERT_EQUAL(tb_scalar(w, "", 9, 1.0), FSDP_ERR_INVALID_ARGUMENT);
    TB_OK(tb_flush(w), tb_last_error(w));
    char path[4096];
    snprintf(path, sizeof path, "%s", tb_path(w));
    TB_OK(tb_close(w), "");

    event ev[16];
    int n = read_events(path, ev, 16);
    CU_ASSERT_EQUAL_FATAL(n, 9);
    CU_ASSERT_STRING_EQUAL(ev[0].file_version, TB_FILE_VERSION);
    CU_ASSERT_EQUAL(ev[0].n_values, 0);
    CU_ASSERT_TRUE(ev[0].wall_time >= (double)before && ev[0].wall_time <= (double)time(NULL) + 1);
    for (int i = 0; i < 6; i++) {
        const event *e = &ev[1 + i];
        CU_ASSERT_STRING_EQUAL(e->tag, tags[i % 3]);
        CU_ASSERT_EQUAL(e->step, steps[i]);
        float want = (float)values[i];
        CU_ASSERT_EQUAL(memcmp(&e->value, &want, 4), 0); /* bit for bit: -0.0 too */
        CU_ASSERT_EQUAL(e->wall_time, 1.7e9 + i * 0.25);
        CU_ASSERT_EQUAL(e->n_values, 1);
        CU_ASSERT_STRING_EQUAL(e->file_version, "");
    }
    CU_ASSERT_STRING_EQUAL(ev[7].tag, "nan");
    CU_ASSERT_TRUE(isnan(ev[7].value));
    CU_ASSERT_EQUAL(ev[7].step, 7);
    CU_ASSERT_EQUAL(strlen(ev[8].tag), TB_MAX_TAG);
    printf("\n    %s: %d records, framing and CRCs hold", strrchr(path, '/') + 1, n);

    /* a flipped byte of a value, and of a length, is caught */
    FILE *f = fopen(path, "r+b");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fseek(f, -6, SEEK_END); /* inside the last record's data */
    int c = fgetc(f);
    fseek(f, -6, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
    CU_ASSERT_EQUAL(read_events(path, ev, 16), -1);
    f = fopen(path, "r+b");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputc(0x7f, f); /* the first record's length */
    fclose(f);
    CU_ASSERT_EQUAL(read_events(path, ev, 16), -1);
}

/* Two writers of one directory (in the same second) never share a file. */
static void test_two_writers(void) {
    char err[512];
    tb_writer *a = NULL, *b = NULL;
    TB_OK(tb_open(scratch("two"), &a, err, sizeof err), err);
    TB_OK(tb_open(scratch("two"), &b, err, sizeof err), err);
    CU_ASSERT_STRING_NOT_EQUAL(tb_path(a), tb_path(b));
    TB_OK(tb_scalar(a, "a", 1, 1.0), "");
    TB_OK(tb_scalar(b, "b", 1, 2.0), "");
    char pa[4096], pb_[4096];
    snprintf(pa, sizeof pa, "%s", tb_path(a));
    snprintf(pb_, sizeof pb_, "%s", tb_path(b));
    TB_OK(tb_close(a), "");
    TB_OK(tb_close(b), "");
    event ev[4];
    CU_ASSERT_EQUAL(read_events(pa, ev, 4), 2);
    CU_ASSERT_STRING_EQUAL(ev[1].tag, "a");
    CU_ASSERT_EQUAL(read_events(pb_, ev, 4), 2);
    CU_ASSERT_STRING_EQUAL(ev[1].tag, "b");
    CU_ASSERT_EQUAL(tb_close(NULL), FSDP_OK);
}

static void test_refused(void) {
    char err[512] = "";
    tb_writer *w = (tb_writer *)&err; /* must be set to NULL */
    FILE *f = fopen(scratch("file"), "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fclose(f);
    CU_ASSERT_EQUAL(tb_open(scratch("file/tb"), &w, err, sizeof err), FSDP_ERR_IO);
    CU_ASSERT_PTR_NULL(w);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot make the TensorBoard directory"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, scratch("file")));
    printf("\n    %s", err);
    CU_ASSERT_EQUAL(tb_open("", &w, err, sizeof err), FSDP_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "no TensorBoard directory"));
    if (geteuid() != 0) { /* root writes anywhere */
        CU_ASSERT_EQUAL_FATAL(mkdir(scratch("ro"), 0500), 0);
        CU_ASSERT_EQUAL(tb_open(scratch("ro"), &w, err, sizeof err), FSDP_ERR_IO);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot create TensorBoard event file"));
        chmod(scratch("ro"), 0700);
    }
}

/* The number after `"key": ` in a metrics record, or NAN when the key is missing. */
static double json_number(const char *line, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static train_config g_cfg; /* large: keep it off the stack */

static void set(const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    fsdp_status st = train_config_set(&g_cfg, assignment, err, sizeof err);
    if (st != FSDP_OK) printf("\n    %s", err);
    CU_ASSERT_EQUAL_FATAL(st, FSDP_OK);
}

/* fsdp-train with [log] tensorboard and metrics on 2 rank threads: one event file (rank 0's),
 * whose events after the file_version are, in order, the scalars of the metrics records: the
 * same steps, tags by key (loss -> train/loss, eval_loss -> eval/loss, ...) and each value the
 * record's as float32. The records print loss, lr, grad_norm and eval values with %.9g, which
 * holds a float32 exactly except when the double lies within the text's rounding (5e-9
 * relative) of the midpoint of two floats: then the neighbour float is allowed, checked to be
 * that case. samples_per_s is printed with %.1f: within 0.05 plus float32 rounding. */
static void test_trainer(void) {
    char err[TRAIN_ERROR_SIZE] = "", a[1200];
    train_result res;
    train_config_init(&g_cfg);
    set("train.steps=30");
    set("train.log_every=10");
    set("train.eval_every=15");
    set("data.eval_fraction=0.25");
    set("optim.clip_grad_norm=1");
    set("parallel.ranks=2");
    set("log.level=warn");
    snprintf(a, sizeof a, "log.metrics=%s", scratch("run/metrics.jsonl"));
    set(a);
    mkdir(scratch("run"), 0755);
    snprintf(a, sizeof a, "log.tensorboard=%s", scratch("run/tb"));
    set(a);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err);
    if (st != FSDP_OK) printf("\n    %s", err);
    CU_ASSERT_EQUAL_FATAL(st, FSDP_OK);

    /* the one event file */
    char cmd[1300], path[1100] = "";
    snprintf(cmd, sizeof cmd, "ls %s | wc -l", scratch("run/tb"));
    FILE *ls = popen(cmd, "r");
    int files = 0;
    CU_ASSERT_EQUAL(fscanf(ls, "%d", &files), 1);
    pclose(ls);
    CU_ASSERT_EQUAL_FATAL(files, 1);
    snprintf(cmd, sizeof cmd, "ls %s/events.out.tfevents.*", scratch("run/tb"));
    ls = popen(cmd, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(fgets(path, sizeof path, ls));
    pclose(ls);
    path[strcspn(path, "\n")] = '\0';
    static event ev[256];
    int n = read_events(path, ev, 256);
    CU_ASSERT_FATAL(n > 1);
    CU_ASSERT_STRING_EQUAL(ev[0].file_version, TB_FILE_VERSION);

    static const char *const keys[][2] = {
        {"loss", "train/loss"},
        {"samples_per_s", "train/samples_per_s"},
        {"tokens_per_s", "train/tokens_per_s"},
        {"lr", "train/lr"},
        {"grad_norm", "train/grad_norm"},
        {"eval_loss", "eval/loss"},
        {"eval_accuracy", "eval/accuracy"},
        {"eval_perplexity", "eval/perplexity"},
    };
    FILE *f = fopen(scratch("run/metrics.jsonl"), "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    char line[4096];
    int at = 1, records = 0, evals = 0, rounded = 0;
    while (fgets(line, sizeof line, f)) {
        long long step = (long long)json_number(line, "step");
        records++;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            double want = json_number(line, keys[k][0]);
            if (isnan(want)) continue;
            CU_ASSERT_FATAL(at < n);
            const event *e = &ev[at++];
            CU_ASSERT_STRING_EQUAL(e->tag, keys[k][1]);
            CU_ASSERT_EQUAL(e->step, step);
            CU_ASSERT_EQUAL(e->n_values, 1);
            evals += strncmp(keys[k][1], "eval/", 5) == 0;
            float w = (float)want;
            if (k == 1 || k == 2) { /* %.1f */
                CU_ASSERT_TRUE(fabs((double)e->value - want) <= 0.05 + 6e-8 * fabs(want));
            } else if (e->value != w) {
                rounded++;
                CU_ASSERT_EQUAL(nextafterf(w, e->value), e->value);
                double mid = ((double)w + (double)e->value) / 2;
                CU_ASSERT_TRUE(fabs(want - mid) <= 5e-9 * fabs(want));
            }
        }
    }
    fclose(f);
    CU_ASSERT_EQUAL(at, n);      /* no event without its record */
    CU_ASSERT_EQUAL(records, 4); /* steps 10, 15 (eval only), 20, 30 */
    CU_ASSERT_EQUAL(evals, 2);   /* eval/loss at steps 15 and 30 (regression: no accuracy) */
    printf("\n    %d records, %d events match (%d at a float32 midpoint)", records, n - 1, rounded);

    /* a directory that cannot be made: refused before training, naming the key */
    FILE *blocker = fopen(scratch("run/file"), "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(blocker);
    fclose(blocker);
    snprintf(a, sizeof a, "log.tensorboard=%s", scratch("run/file/tb"));
    set(a);
    set("log.metrics=");
    err[0] = '\0';
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err), FSDP_ERR_IO);
    printf("\n    %s", err);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "[log] tensorboard"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot make the TensorBoard directory"));
    CU_ASSERT_EQUAL(res.steps, 0);
}

static int setup(void) {
    char tmpl[] = "/tmp/test_tensorboard-XXXXXX";
    if (!mkdtemp(tmpl)) return -1;
    g_root = strdup(tmpl);
    return 0;
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"crc", test_crc},
        {"write_read", test_write_read},
        {"two_writers", test_two_writers},
        {"refused", test_refused},
        {"trainer", test_trainer},
    };
    if (setup() != 0) return 2;
    int rc = fsdp_test_run(argc, argv, "tensorboard", cases, (int)(sizeof cases / sizeof cases[0]));
    ckpt_test_remove_tree(g_root);
    free(g_root);
    return rc;
}
