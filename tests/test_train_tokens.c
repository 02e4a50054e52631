/* test_train_tokens.c: the token formats of fsdp-train's [data] kind = tokens besides its own
 * (tools/train_token_formats.c, tools/train_tokens.c): the same ids written as a token file,
 * an llm.c .bin shard (both magics) and .npy arrays (versions 1.0, 2.0, 3.0; '<u2', '<i4',
 * '<u4', '<i8') read back as the same stream, id for id; a glob pattern over shards of mixed
 * formats read in name order as one stream, sequences crossing shard boundaries; a short
 * training run on the raw file, the .bin, the .npy and the shards gives bitwise the same losses;
 * corrupted .bin and .npy files (every header field, the size, ids out of range or negative)
 * and a pattern matching nothing are refused naming the file, the field and the fix. */
#define _POSIX_C_SOURCE 200809L // mkdtemp

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: mkdir
#include <unistd.h>

#include "ckpt_common.h" // defines: ckpt_test_remove_tree
#include "harness.h"
#include "train_config.h" // defines: train_config_init, train_config_set
#include "train_tokens.h" // defines: train_tokens_load, train_tokens_read
#include "trainer.h"      // defines: train_run

static train_config g_cfg; /* large: keep it off the stack */
static char *g_root;       /* this run's scratch directory */

#define SET(...) ((const char *const[]){__VA_ARGS__, NULL})

#define N_TOKENS 6000
static uint32_t g_ids[N_TOKENS];

/* "<root>/<name>", in a static ring of buffers. */
static const char *scratch(const char *name) {
    static char bufs[8][1100];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", g_root, name);
    return b;
}

/* Words of a small vocabulary drawn by a fixed LCG, as bytes: ids in [32, 122]. */
static void make_text(void) {
    static const char *const words[] = {"the ", "cat ", "sat ", "on ", "a ",   "mat ",
                                        "and ", "dog ", "ran ", "to ", "her ", "house "};
    uint32_t x = 4321;
    int64_t n = 0;
    while (n < N_TOKENS) {
        x = x * 1103515245u + 12345u;
        for (const char *w = words[(x >> 16) % 12]; *w && n < N_TOKENS; w++)
            g_ids[n++] = (unsigned char)*w;
    }
}

/* ---- writers ----------------------------------------------------------------------------- */

static void put_le(FILE *f, uint64_t v, int n) {
    for (int i = 0; i < n; i++) fputc((int)(v >> (8 * i) & 0xff), f);
}

/* ids [first, first + n) as `bytes`-byte little-endian values; `poke` >= 0 replaces id poke by
 * poke_value (two's complement). */
static void put_ids(FILE *f, int64_t first, int64_t n, int bytes, int64_t poke,
                    int64_t poke_value) {
    for (int64_t i = first; i < first + n; i++)
        put_le(f, i == poke ? (uint64_t)poke_value : g_ids[i], bytes);
}

static void write_tok(const char *path, int64_t first, int64_t n) {
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fwrite(TRAIN_TOKENS_MAGIC, 1, 8, f);
    put_le(f, 1, 4);
    put_le(f, 2, 4);
    put_le(f, (uint64_t)n, 8);
    put_le(f, 256, 8);
    put_ids(f, first, n, 2, -1, 0);
    CU_ASSERT_EQUAL(fclose(f), 0);
}

/* An llm.c shard: header[0..2] = magic, version, count (as given), the rest zero, then n ids
 * of the size the magic implies (2 for GPT-2's, 4 for Llama 3's), then `extra` zero bytes. */
typedef struct bin_spec {
    int32_t magic, version, count;
    int64_t n;
    int extra;
    int64_t poke, poke_value;
} bin_spec;

static void write_bin(const char *path, int64_t first, bin_spec s) {
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    int32_t h[256] = {s.magic, s.version, s.count};
    for (int i = 0; i < 256; i++) put_le(f, (uint32_t)h[i], 4);
    put_ids(f, first, s.n, s.magic == TRAIN_LLMC_MAGIC_LLAMA ? 4 : 2, s.poke, s.poke_value);
    for (int i = 0; i < s.extra; i++) fputc(0, f);
    CU_ASSERT_EQUAL(fclose(f), 0);
}

static bin_spec good_bin(int64_t n) {
    return (bin_spec){TRAIN_LLMC_MAGIC_GPT2, 1, (int32_t)n, n, 0, -1, 0};
}

/* A .npy file of format `major`.`minor` with the dict text `dict` (padded with spaces and a
 * newline to a multiple of 64 bytes, as numpy does), then n ids of `bytes` bytes. */
typedef struct npy_spec {
    int major, minor;
    const char *dict;
    int bytes;
    int64_t n;
    int64_t poke, poke_value;
    int64_t header_len; /* > 0: written instead of the true length */
} npy_spec;

static void write_npy(const char *path, int64_t first, npy_spec s) {
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    int start = s.major == 1 ? 10 : 12;
    size_t len = strlen(s.dict) + 1, total = ((size_t)start + len + 63) / 64 * 64;
    size_t hlen = total - (size_t)start;
    fwrite("\x93NUMPY", 1, 6, f);
    fputc(s.major, f);
    fputc(s.minor, f);
    put_le(f, s.header_len > 0 ? (uint64_t)s.header_len : hlen, s.major == 1 ? 2 : 4);
    fputs(s.dict, f);
    for (size_t i = len; i < hlen; i++) fputc(' ', f);
    fputc('\n', f);
    put_ids(f, first, s.n, s.bytes, s.poke, s.poke_value);
    CU_ASSERT_EQUAL(fclose(f), 0);
}

/* numpy.save's dict for a 1-D array of n ids of dtype descr. */
static const char *npy_dict(const char *descr, int64_t n) {
    static char bufs[4][200];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof bufs[0], "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }",
             descr, (long long)n);
    return b;
}

static npy_spec good_npy(int major, const char *descr, int bytes, int64_t n) {
    return (npy_spec){major, 0, npy_dict(descr, n), bytes, n, -1, 0, 0};
}

/* ---- configuration ----------------------------------------------------------------------- */

static void set(const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    FSDP_TEST_OK(train_config_set(&g_cfg, assignment, err, sizeof err));
}

/* fsdp-train's tiny Llama of test_train_llama: 2 layers of dim 32, sequences of 16, 4 per
 * batch, SGD, an evaluation every 2 steps over 2 held-out batches. */
static void config(const char *path, const char *const *overrides) {
    static const char *const small[] = {"model.kind=llama",      "model.dim=32",
                                        "model.n_layers=2",      "model.n_heads=4",
                                        "model.n_kv_heads=2",    "model.ffn_hidden=64",
                                        "model.max_seq_len=16",  "data.kind=tokens",
                                        "data.batch_size=4",     "data.eval_fraction=0.1",
                                        "data.eval_batches=2",   "optim.name=sgd",
                                        "optim.lr=0.5",          "train.steps=4",
                                        "train.log_every=2",     "train.eval_every=2",
                                        "log.level=off",         "parallel.backend=local",
                                        "parallel.timeout_s=60", NULL};
    char p[1300];
    train_config_init(&g_cfg);
    for (int i = 0; small[i]; i++) set(small[i]);
    snprintf(p, sizeof p, "data.path=%s", path);
    set(p);
    for (int i = 0; overrides && overrides[i]; i++) set(overrides[i]);
}

/* Loads path; the stream must be g_ids[0, n) (every id, read in windows of 7 and whole). */
static void check_stream(const char *path, int64_t n, int shards) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_tokens t;
    config(path, NULL);
    fsdp_status st = train_tokens_load(&g_cfg, &t, err, sizeof err);
    if (st != FSDP_OK) printf("\n    %s: %s", path, err);
    CU_ASSERT_EQUAL_FATAL(st, FSDP_OK);
    CU_ASSERT_EQUAL(t.count, n);
    CU_ASSERT_EQUAL(t.n_shards, shards);
    uint32_t *got = calloc((size_t)n, sizeof *got);
    CU_ASSERT_PTR_NOT_NULL_FATAL(got);
    train_tokens_read(&t, 0, n, got);
    CU_ASSERT_EQUAL(memcmp(got, g_ids, (size_t)n * sizeof *got), 0);
    bool same = true;
    for (int64_t i = 0; i < n; i += 7) {
        uint32_t w[7];
        int64_t k = n - i < 7 ? n - i : 7;
        train_tokens_read(&t, i, k, w);
        same = same && memcmp(w, g_ids + i, (size_t)k * sizeof *w) == 0;
    }
    CU_ASSERT_TRUE(same);
    free(got);
    train_tokens_free(&t);
}

/* ---- the formats ------------------------------------------------------------------------- */

static void test_formats(void) {
    write_tok(scratch("raw.tok"), 0, N_TOKENS);
    check_stream(scratch("raw.tok"), N_TOKENS, 1);
    write_bin(scratch("gpt2.bin"), 0, good_bin(N_TOKENS));
    check_stream(scratch("gpt2.bin"), N_TOKENS, 1);
    bin_spec llama = good_bin(N_TOKENS);
    llama.magic = TRAIN_LLMC_MAGIC_LLAMA;
    write_bin(scratch("llama3.bin"), 0, llama);
    check_stream(scratch("llama3.bin"), N_TOKENS, 1);
    static const struct {
        int major;
        const char *descr;
        int bytes;
    } npys[] = {{1, "<u2", 2}, {1, "<i4", 4}, {2, "<u4", 4}, {3, "<i8", 8}, {1, "<i8", 8}};
    for (size_t i = 0; i < sizeof npys / sizeof npys[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "v%d-%s.npy", npys[i].major, npys[i].descr + 1);
        write_npy(scratch(name), 0,
                  good_npy(npys[i].major, npys[i].descr, npys[i].bytes, N_TOKENS));
        check_stream(scratch(name), N_TOKENS, 1);
    }
    /* numpy's other spellings: double quotes, no trailing comma, keys in another order */
    npy_spec other = good_npy(1, "<u2", 2, N_TOKENS);
    other.dict = "{\"shape\": (6000,), \"fortran_order\": False, \"descr\": \"<u2\"}";
    write_npy(scratch("other.npy"), 0, other);
    check_stream(scratch("other.npy"), N_TOKENS, 1);
}

/* Shards of three formats named so that name order (strcmp: "part-10" < "part-2" < "part-3")
 * is not the order of writing; the stream is their concatenation in name order. */
static void write_shards(void) {
    write_npy(scratch("shards/part-10.npy"), 0, good_npy(1, "<u2", 2, 1000));
    write_bin(scratch("shards/part-2.bin"), 1000,
              (bin_spec){TRAIN_LLMC_MAGIC_GPT2, 1, 2501, 2501, 0, -1, 0});
    write_tok(scratch("shards/part-3.tok"), 3501, N_TOKENS - 3501);
    write_tok(scratch("shards/other.txt"), 0, 10); /* not matched by part-* */
}

static void test_glob(void) {
    CU_ASSERT_EQUAL_FATAL(mkdir(scratch("shards"), 0700), 0);
    write_shards();
    check_stream(scratch("shards/part-*"), N_TOKENS, 3);
    /* reads that cross both boundaries, and one that starts on a shard's first id */
    char err[TRAIN_ERROR_SIZE];
    train_tokens t;
    config(scratch("shards/part-*"), NULL);
    FSDP_TEST_OK(train_tokens_load(&g_cfg, &t, err, sizeof err));
    uint32_t w[3000];
    train_tokens_read(&t, 990, 2520, w);
    CU_ASSERT_EQUAL(memcmp(w, g_ids + 990, 2520 * sizeof *w), 0);
    train_tokens_read(&t, 3501, 5, w);
    CU_ASSERT_EQUAL(memcmp(w, g_ids + 3501, 5 * sizeof *w), 0);
    CU_ASSERT_EQUAL(t.shards[0].first, 0);
    CU_ASSERT_EQUAL(t.shards[1].first, 1000);
    CU_ASSERT_EQUAL(t.shards[2].first, 3501);
    CU_ASSERT_PTR_NOT_NULL(strstr(t.shards[0].path, "part-10.npy"));
    train_tokens_free(&t);
}

/* ---- training on each ------------------------------------------------------------------ */

static bool same_losses(const char *what, const train_result *a, const train_result *b) {
    bool ok = a->n_step_losses == b->n_step_losses && a->n_step_losses == 4 &&
              a->first_loss == b->first_loss && a->last_loss == b->last_loss &&
              a->eval_loss == b->eval_loss;
    for (int i = 0; ok && i < 4; i++) ok = a->step_loss[i] == b->step_loss[i];
    printf("\n    %-26s losses %.9g %.9g, held-out %.9g: %s", what, a->step_loss[0],
           a->step_loss[3], a->eval_loss, ok ? "bitwise equal" : "DIFFERENT");
    return ok;
}

/* The same tokens as a token file, an llm.c shard, .npy arrays and three shards of a glob:
 * bitwise the same losses (the same sequences, the same arithmetic). */
static void test_train_same(void) {
    char err[TRAIN_ERROR_SIZE];
    train_result ref, res;
    config(scratch("raw.tok"), NULL);
    FSDP_TEST_OK(train_run(fsdp_test_ctx(), &g_cfg, NULL, &ref, err, sizeof err));
    CU_ASSERT_TRUE(ref.last_loss < ref.first_loss);
    static const char *const others[] = {"gpt2.bin", "llama3.bin", "v1-u2.npy", "v3-i8.npy",
                                         "shards/part-*"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        config(scratch(others[i]), NULL);
        FSDP_TEST_OK(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err));
        CU_ASSERT_TRUE(same_losses(others[i], &res, &ref));
    }
    /* a changed id (every 37th) changes the losses: the comparison can fail */
    npy_spec many = good_npy(1, "<u2", 2, N_TOKENS);
    uint32_t keep[N_TOKENS];
    memcpy(keep, g_ids, sizeof keep);
    for (int64_t i = 0; i < N_TOKENS; i += 37) g_ids[i] = 'q';
    write_npy(scratch("changed.npy"), 0, many);
    memcpy(g_ids, keep, sizeof keep);
    config(scratch("changed.npy"), NULL);
    FSDP_TEST_OK(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err));
    CU_ASSERT_NOT_EQUAL(res.step_loss[0], ref.step_loss[0]);
}

/* ---- refusals ---------------------------------------------------------------------------- */

/* Loading path fails with `want`; the message names `names` (the file) and every needle. */
static void refuse_at(const char *path, const char *names, fsdp_status want,
                      const char *const *needles) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_tokens t;
    config(path, NULL);
    fsdp_status st = train_tokens_load(&g_cfg, &t, err, sizeof err);
    CU_ASSERT_EQUAL(st, want);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, names));
    bool all = true;
    for (int i = 0; needles[i]; i++)
        if (!strstr(err, needles[i])) {
            printf("\n    no '%s' in: %s", needles[i], err);
            all = false;
        }
    CU_ASSERT_TRUE(all);
    const char *base = strrchr(names, '/');
    printf("\n    %s: %s", base ? base + 1 : names, err);
    if (st == FSDP_OK) train_tokens_free(&t);
}

static void refuse(const char *path, const char *const *needles) {
    refuse_at(path, path, FSDP_ERR_CONFIG, needles);
}

static void refuse_bin(const char *name, bin_spec s, const char *const *needles) {
    write_bin(scratch(name), 0, s);
    refuse(scratch(name), needles);
}

static void refuse_npy(const char *name, npy_spec s, const char *const *needles) {
    write_npy(scratch(name), 0, s);
    refuse(scratch(name), needles);
}

static void test_bad_bin(void) {
    FILE *f = fopen(scratch("short.bin"), "wb"); /* the magic, then 96 bytes of 1024 */
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    put_le(f, TRAIN_LLMC_MAGIC_GPT2, 4);
    for (int i = 0; i < 96; i++) fputc(0, f);
    fclose(f);
    refuse(scratch("short.bin"), SET("100 bytes", "1024-byte header", "truncated"));
    bin_spec s = good_bin(N_TOKENS);
    s.version = 2;
    refuse_bin("version.bin", s, SET("version (header[1]) is 2", "have version 1", "uint16"));
    s = good_bin(N_TOKENS);
    s.count = 0;
    refuse_bin("zero.bin", s, SET("token count (header[2]) is 0", "damaged"));
    s.count = -5;
    refuse_bin("negative.bin", s, SET("token count (header[2]) is -5"));
    s = good_bin(5000);
    s.count = N_TOKENS;
    refuse_bin(
        "truncated.bin", s,
        SET("says 6000 tokens of 2 bytes", "10000 bytes after the 1024-byte header", "truncated"));
    s = good_bin(N_TOKENS);
    s.extra = 3;
    refuse_bin("longer.bin", s,
               SET("says 6000 tokens", "12003 bytes after", "6001 tokens and 1 bytes over"));
    s = good_bin(N_TOKENS);
    s.magic = TRAIN_LLMC_MAGIC_LLAMA; /* uint32 ids, but written as... */
    s.n = N_TOKENS / 2;               /* half as many 4-byte ids: the size says 3000 */
    refuse_bin("llama3-count.bin", s, SET("says 6000 tokens of 4 bytes", "3000 tokens"));
    s = good_bin(N_TOKENS);
    s.poke = 4321, s.poke_value = 300;
    refuse_bin("id.bin", s,
               SET("token 4321", "is 300", "[model] vocab_size = 256", "at least 301"));
    f = fopen(scratch("empty.bin"), "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fclose(f);
    refuse(scratch("empty.bin"), SET("0 bytes", "the file is empty", "not a token file"));
}

static void test_bad_npy(void) {
    npy_spec s = good_npy(1, "<u2", 2, N_TOKENS);
    s.major = 4;
    refuse_npy("v4.npy", s, SET("format version 4.0", "1.0, 2.0 and 3.0"));
    s = good_npy(1, "<u2", 2, N_TOKENS);
    s.header_len = 60000;
    refuse_npy("hlen.npy", s, SET("header length is 60000", "truncated or damaged"));
    s = good_npy(2, "<u2", 2, N_TOKENS);
    s.header_len = 0x7fffffff;
    refuse_npy("hlen2.npy", s, SET("header length is 2147483647"));
    s.header_len = 0;
    s.dict = "['descr', '<u2']";
    refuse_npy("list.npy", s, SET("not a dict"));
    s.dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (6000,), 'extra': 1}";
    refuse_npy("key.npy", s, SET("unknown key 'extra'"));
    s.dict = "{'descr': '<u2', 'descr': '<u2', 'shape': (6000,)}";
    refuse_npy("twice.npy", s, SET("repeated key 'descr'"));
    s.dict = "{'descr': '<u2', 'fortran_order': False}";
    refuse_npy("noshape.npy", s, SET("no 'shape' key"));
    s.dict = "{'descr': '<u2', 'fortran_order': Maybe, 'shape': (6000,)}";
    refuse_npy("fortran-value.npy", s, SET("'fortran_order' value cannot be read"));
    s.dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (6000,)} x";
    refuse_npy("after.npy", s, SET("text after its dict"));
    s.dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (99999999999999999999,)}";
    refuse_npy("huge-dim.npy", s, SET("'shape' value cannot be read"));
    s = good_npy(1, ">u2", 2, N_TOKENS);
    refuse_npy("big-endian.npy", s, SET("dtype is '>u2'", "'<u2' (uint16)", "astype"));
    s = good_npy(1, "<f4", 4, N_TOKENS);
    refuse_npy("float.npy", s, SET("dtype is '<f4'"));
    s = good_npy(1, "<u2", 2, N_TOKENS);
    s.dict = "{'descr': '<u2', 'fortran_order': True, 'shape': (6000,), }";
    refuse_npy("fortran.npy", s, SET("Fortran order", "ascontiguousarray"));
    s.dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3000), }";
    refuse_npy("2d.npy", s, SET("shape (2, 3000), 2-D", "reshape(-1)"));
    s.dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (), }";
    refuse_npy("0d.npy", s, SET("shape (), 0-D"));
    s = good_npy(1, "<u2", 2, 5000);
    s.dict = npy_dict("<u2", N_TOKENS);
    refuse_npy("truncated.npy", s,
               SET("its .npy shape says 6000 tokens of 2 bytes", "10000 bytes after", "truncated"));
    s = good_npy(1, "<i4", 4, N_TOKENS);
    s.poke = 17, s.poke_value = -3;
    refuse_npy("negative.npy", s, SET("token 17", "is -3, negative"));
    s = good_npy(1, "<i8", 8, N_TOKENS);
    s.poke = 5999, s.poke_value = INT64_C(1) << 40;
    refuse_npy("large.npy", s, SET("token 5999", "is 1099511627776", "at least 1099511627777"));
    s = good_npy(1, "<u2", 2, N_TOKENS);
    s.n = 0;
    s.dict = npy_dict("<u2", 0);
    refuse_npy("empty.npy", s, SET("holds no tokens"));
}

/* A pattern that matches nothing; a bad shard among good ones is named itself. */
static void test_bad_glob(void) {
    refuse_at(scratch("shards/none-*.bin"), "shards/none-*.bin", FSDP_ERR_CONFIG,
              SET("a pattern that matches no file", "shard_*.bin"));
    CU_ASSERT_EQUAL_FATAL(mkdir(scratch("bad-shards"), 0700), 0);
    write_bin(scratch("bad-shards/a.bin"), 0, good_bin(3000));
    bin_spec s = good_bin(3000);
    s.version = 7;
    write_bin(scratch("bad-shards/b.bin"), 3000, s);
    refuse_at(scratch("bad-shards/*.bin"), scratch("bad-shards/b.bin"), FSDP_ERR_CONFIG,
              SET("matched by [data] path", "bad-shards/*.bin", "header[1]) is 7"));
    /* the stream's split: too few training tokens over all shards together */
    CU_ASSERT_EQUAL_FATAL(mkdir(scratch("tiny"), 0700), 0);
    write_bin(scratch("tiny/a.bin"), 0, good_bin(8));
    write_bin(scratch("tiny/b.bin"), 8, good_bin(8));
    refuse_at(scratch("tiny/*.bin"), "the token files of [data] path", FSDP_ERR_CONFIG,
              SET("15 training tokens (of 16", "max_seq_len + 1 = 17"));
}

static int setup(void) {
    char tmpl[] = "/tmp/test_train_tokens-XXXXXX";
    if (!mkdtemp(tmpl)) return -1;
    g_root = strdup(tmpl);
    make_text();
    return 0;
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"formats", test_formats}, {"glob", test_glob},       {"train_same", test_train_same},
        {"bad_bin", test_bad_bin}, {"bad_npy", test_bad_npy}, {"bad_glob", test_bad_glob},
    };
    if (setup() != 0) return 2;
    int rc =
        fsdp_test_run(argc, argv, "train_tokens", cases, (int)(sizeof cases / sizeof cases[0]));
    ckpt_test_remove_tree(g_root);
    free(g_root);
    return rc;
}
