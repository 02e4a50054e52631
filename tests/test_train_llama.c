/* test_train_llama.c: fsdp-train's [model] kind = llama on [data] kind = tokens (train_run, the
 * loop the tool runs): a tiny Llama on a token file written here gives the single-rank run's
 * step, probe and held-out losses at (dp, tp) = (2, 1), (1, 2), (2, 2) (FSDP per decoder layer,
 * TP with loss parallel, an uneven vocabulary at tp 2, replicate) to float32 rounding under
 * SGD (Adam would amplify that rounding chaotically: see RTOL), and
 * activation checkpointing changes no bit; the loss falls below the data's unigram entropy;
 * bad token files (short, truncated, wrong magic, version or id size, count mismatch, an id or
 * a header vocabulary >= vocab_size, too few tokens) and bad [model] keys fail naming the file
 * or key and the fix; a stopped run resumes bitwise at the same layout (checkpoints included)
 * and to float32 rounding at another; a run's checkpoint exports as a Hugging Face model
 * directory (its config.json saved with it) whose import gives its parameters bitwise;
 * examples/llama-austen.ini checks out. */
#define _POSIX_C_SOURCE 200809L // mkdtemp, mkfifo, alarm

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_common.h" // defines: ckpt_test_remove_tree
#include "fixture.h"     // defines: fixture_load_named, fixture_require
#include "harness.h"
#include "numerics.h"     // defines: fsdp_test_sum_tol
#include "train_config.h" // defines: train_config_init, train_config_set, train_config_load
#include "train_llama.h"  // defines: train_llama_config
#include "train_tokens.h" // defines: TRAIN_TOKENS_MAGIC, TRAIN_TOKENS_HEADER
#include "trainer.h"      // defines: train_run

static train_config g_cfg;  /* large: keep it off the stack */
static char *g_root;        /* this run's scratch directory */
static char g_tokens[1200]; /* the good token file */

#define SET(...) ((const char *const[]){__VA_ARGS__, NULL})

/* "<root>/<name>", in a static ring of buffers. */
static const char *scratch(const char *name) {
    static char bufs[8][1100];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", g_root, name);
    return b;
}

/* ---- token files ------------------------------------------------------------------------- */

typedef struct header {
    const char *magic; /* 8 bytes */
    uint32_t version, bytes;
    uint64_t count, vocab;
} header;

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Writes h, then n ids of h.bytes bytes each (whatever h.count says), then `extra` zero bytes. */
static bool write_file(const char *path, header h, const uint32_t *ids, int64_t n, int extra) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    unsigned char hd[TRAIN_TOKENS_HEADER];
    memcpy(hd, h.magic, 8);
    put_le(hd + 8, h.version, 4);
    put_le(hd + 12, h.bytes, 4);
    put_le(hd + 16, h.count, 8);
    put_le(hd + 24, h.vocab, 8);
    fwrite(hd, 1, sizeof hd, f);
    for (int64_t i = 0; i < n; i++) {
        unsigned char b[4];
        put_le(b, ids[i], (int)h.bytes);
        fwrite(b, 1, h.bytes, f);
    }
    for (int i = 0; i < extra; i++) fputc(0, f);
    return fclose(f) == 0;
}

#define N_TOKENS 6000

static uint32_t g_ids[N_TOKENS];

/* A text with structure to learn: words of a small vocabulary, drawn by a fixed LCG, as bytes
 * (a-z and spaces), so the loss can fall below the unigram entropy. */
static void make_text(void) {
    static const char *const words[] = {"the ", "cat ", "sat ", "on ", "a ",   "mat ",
                                        "and ", "dog ", "ran ", "to ", "her ", "house "};
    uint32_t x = 12345;
    int64_t n = 0;
    while (n < N_TOKENS) {
        x = x * 1103515245u + 12345u;
        const char *w = words[(x >> 16) % 12];
        for (; *w && n < N_TOKENS; w++) g_ids[n++] = (unsigned char)*w;
    }
}

static header good_header(void) {
    return (header){TRAIN_TOKENS_MAGIC, 1, 2, N_TOKENS, 256};
}

static void set(const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    FSDP_TEST_OK(train_config_set(&g_cfg, assignment, err, sizeof err));
    if (err[0]) printf("\n    %s", err);
}

/* The tiny Llama: 2 layers of dim 32, 4 query and 2 key/value heads, sequences of 16, 4 per
 * batch, AdamW, 10 steps, an evaluation every 5 over 2 batches of held-out sequences. */
static const char *const g_small[] = {
    "model.kind=llama",       "model.dim=32",           "model.n_layers=2",
    "model.n_heads=4",        "model.n_kv_heads=2",     "model.ffn_hidden=64",
    "model.max_seq_len=16",   "data.kind=tokens",       "data.batch_size=4",
    "data.eval_fraction=0.1", "data.eval_batches=2",    "optim.name=adamw",
    "optim.lr=0.01",          "optim.weight_decay=0.1", "optim.clip_grad_norm=1",
    "train.steps=10",         "train.log_every=5",      "train.eval_every=5",
    "log.level=off",          "parallel.backend=local", "parallel.timeout_s=60"};
#define N_SMALL ((int)(sizeof g_small / sizeof g_small[0]))

/* The layout comparisons train with SGD (momentum 0.9) instead: see RTOL. */
static const char *const g_sgd[] = {"optim.name=sgd", "optim.lr=0.5", NULL};

static void small_config_with(const char *const *optim, const char *const *overrides) {
    char path[1300];
    train_config_init(&g_cfg);
    for (int i = 0; i < N_SMALL; i++) set(g_small[i]);
    snprintf(path, sizeof path, "data.path=%s", g_tokens);
    set(path);
    for (int i = 0; optim && optim[i]; i++) set(optim[i]);
    for (int i = 0; overrides && overrides[i]; i++) set(overrides[i]);
}

static void small_config(const char *const *overrides) {
    small_config_with(NULL, overrides);
}

static fsdp_status run_with(const char *const *optim, const char *const *overrides,
                            train_result *res, char *err) {
    small_config_with(optim, overrides);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, res, err, TRAIN_ERROR_SIZE);
    if (st != FSDP_OK) printf("\n    train_run: %s", err);
    return st;
}

static fsdp_status run_small(const char *const *overrides, train_result *res, char *err) {
    return run_with(NULL, overrides, res, err);
}

/* run_small with SGD. */
static fsdp_status run_sgd(const char *const *overrides, train_result *res, char *err) {
    return run_with(g_sgd, overrides, res, err);
}

/* ---- layouts ----------------------------------------------------------------------------- */

/* Step losses, the probe losses before and after, the held-out loss: within rtol (0: equal). */
static bool same_run(const char *what, const train_result *got, const train_result *want,
                     double rtol) {
    bool ok = got->n_step_losses == want->n_step_losses && got->n_step_losses == 10;
    double worst = 0;
    double g[13], w[13];
    for (int i = 0; ok && i < 10; i++) g[i] = got->step_loss[i], w[i] = want->step_loss[i];
    g[10] = got->first_loss, w[10] = want->first_loss;
    g[11] = got->last_loss, w[11] = want->last_loss;
    g[12] = got->eval_loss, w[12] = want->eval_loss;
    for (int i = 0; ok && i < 13; i++) {
        double rel = fabs(g[i] - w[i]) / fabs(w[i]);
        worst = fmax(worst, rel);
        if (!(rel <= rtol)) {
            printf("\n    %s: loss %d is %.9g, want %.9g (rel %.2e)", what, i, g[i], w[i], rel);
            ok = false;
        }
    }
    printf("\n    %-44s max rel diff %.1e", what, worst);
    return ok;
}

/* The layouts' losses against the single rank's, under SGD: SGD moves each parameter by lr
 * times its gradient, so the layouts' reordered sums (a few u of each gradient) reach the
 * parameters in proportion, and the losses (the softmax's sums reordered too) differ by a few
 * tens of u at most over 10 steps; seen 2.3e-7 (4 u) under OpenBLAS's Haswell, Sandybridge and
 * Prescott kernels. Under AdamW these runs differed by up to 1.4e-5, and by as much between
 * two single-rank runs that only accumulate the batch in two halves: Adam divides by sqrt(v),
 * so an element whose gradient passes near zero turns that rounding into a move of up to lr,
 * and a loss compared after it is a random draw, not a bound. */
#define RTOL 1e-5

static void check_layout(const train_result *ref, const char *what, const char *const *overrides,
                         int dp, int tp, double rtol) {
    train_result res;
    char err[TRAIN_ERROR_SIZE];
    FSDP_TEST_OK(run_sgd(overrides, &res, err));
    CU_ASSERT_EQUAL(res.layout.dp, dp);
    CU_ASSERT_EQUAL(res.layout.tp, tp);
    CU_ASSERT_TRUE(same_run(what, &res, ref, rtol));
}

static void test_layouts(void) {
    train_result ref;
    char err[TRAIN_ERROR_SIZE];
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=1"), &ref, err));
    printf("\n    one rank: probe loss %.6f -> %.6f, held-out %.6f", ref.first_loss, ref.last_loss,
           ref.eval_loss);
    CU_ASSERT_TRUE(ref.last_loss < ref.first_loss);
    check_layout(&ref, "(2, 1) fsdp wrap layer", SET("parallel.ranks=2", "parallel.wrap=layer"), 2,
                 1, RTOL);
    check_layout(&ref, "(1, 2) tp, loss parallel", SET("parallel.ranks=2", "parallel.tp=2"), 1, 2,
                 RTOL);
    check_layout(&ref, "(2, 2) fsdp wrap layer, tp",
                 SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer"), 2, 2, RTOL);
    check_layout(&ref, "(2, 2) fsdp root only, use_orig_params",
                 SET("parallel.ranks=4", "parallel.tp=2", "parallel.use_orig_params=true"), 2, 2,
                 RTOL);
    check_layout(&ref, "(2, 2) replicate",
                 SET("parallel.ranks=4", "parallel.tp=2", "parallel.mode=replicate"), 2, 2, RTOL);
    check_layout(&ref, "(4, 1) hybrid_shard wrap layer",
                 SET("parallel.ranks=4", "parallel.strategy=hybrid_shard", "parallel.wrap=layer"),
                 4, 1, RTOL);
    check_layout(&ref, "(2, 2) shard_grad_op, offload, checkpointing",
                 SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer",
                     "parallel.strategy=shard_grad_op", "parallel.offload=true",
                     "model.checkpoint_activations=model.layers.*"),
                 2, 2, RTOL);
    check_layout(
        &ref, "(2, 2) grad_accum 2 (micro-batches of 2)",
        SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer", "train.grad_accum=2"), 2, 2,
        RTOL);
    /* activation checkpointing recomputes the same activations: bitwise the run without */
    train_result plain, ckpt;
    FSDP_TEST_OK(
        run_sgd(SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer"), &plain, err));
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer",
                             "model.checkpoint_activations=model.layers.*"),
                         &ckpt, err));
    CU_ASSERT_TRUE(same_run("(2, 2) checkpoint_activations = model.layers.*", &ckpt, &plain, 0));
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=1", "model.checkpoint_activations=model.layers.*"),
                         &ckpt, err));
    CU_ASSERT_TRUE(same_run("(1, 1) checkpoint_activations = model.layers.*", &ckpt, &ref, 0));
}

/* A vocabulary of 257 splits 129 + 128 over tp 2 (lm_head and the embedding). */
static void test_uneven_vocab(void) {
    train_result ref;
    char err[TRAIN_ERROR_SIZE];
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=1", "model.vocab_size=257"), &ref, err));
    check_layout(
        &ref, "(2, 2) vocab 257",
        SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer", "model.vocab_size=257"), 2,
        2, RTOL);
}

/* Llama 3's rope scaling (factor 8, original length 100: with head size 8 and theta 10000 the
 * frequencies are kept, interpolated and divided) at (2, 2) against one rank, and a run that
 * differs from the unscaled one (the keys reach the model). */
static void test_rope_scaling(void) {
    train_result ref, plain;
    char err[TRAIN_ERROR_SIZE];
#define ROPE3 "model.rope_scaling=llama3", "model.rope_original_max_len=100"
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=1", ROPE3), &ref, err));
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=1"), &plain, err));
    printf("\n    probe loss before training %.7f, without the scaling %.7f", ref.first_loss,
           plain.first_loss);
    CU_ASSERT_NOT_EQUAL(ref.first_loss, plain.first_loss);
    check_layout(&ref, "(2, 2) rope_scaling llama3",
                 SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer", ROPE3), 2, 2,
                 RTOL);
#undef ROPE3
}

static void hf_export_case(const char *name, const char *const *overrides, bool tied);

/* Tied embeddings (tie_embeddings: lm_head over the embedding's weight): (2, 1) with FSDP per
 * layer (the root holds both uses), (1, 2) with the embedding's and lm_head's Shard(0) the one
 * placement of the shared weight, and (2, 2), against one rank under SGD; a loss other than the
 * untied model's; a checkpoint of the (2, 2) run exports without lm_head.weight and with
 * tie_word_embeddings true, and imports back bitwise. */
static void test_tied(void) {
    train_result ref, untied;
    char err[TRAIN_ERROR_SIZE];
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=1", "model.tie_embeddings=true"), &ref, err));
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=1"), &untied, err));
    printf("\n    one rank, tied: probe loss %.6f -> %.6f (untied: %.6f -> %.6f)", ref.first_loss,
           ref.last_loss, untied.first_loss, untied.last_loss);
    CU_ASSERT_TRUE(ref.last_loss < ref.first_loss);
    CU_ASSERT_NOT_EQUAL(ref.first_loss, untied.first_loss);
    check_layout(&ref, "(2, 1) tied, fsdp wrap layer",
                 SET("parallel.ranks=2", "parallel.wrap=layer", "model.tie_embeddings=true"), 2, 1,
                 RTOL);
    check_layout(&ref, "(1, 2) tied, tp",
                 SET("parallel.ranks=2", "parallel.tp=2", "model.tie_embeddings=true"), 1, 2, RTOL);
    check_layout(&ref, "(2, 2) tied, fsdp wrap layer, tp",
                 SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer",
                     "model.tie_embeddings=true"),
                 2, 2, RTOL);
    hf_export_case("hf-tied",
                   SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer",
                       "model.tie_embeddings=true"),
                   true);
}

/* [model] autocast = bf16 reaches the model: the probe loss before training differs from the
 * f32 run's, by less than 1% (bf16 rounds each Linear's inputs and outputs by at most 2^-8
 * relative, each rounding moving the loss by at most 2^-8 of its share; tests/test_autocast.c
 * bounds it: 0.005 of that bound used, 7e-4 of the loss, at a tenfold init_std), and the run
 * learns. Before training, (2, 1) with
 * FSDP per layer gives the probe loss of one rank to rtol 1e-5: its ranks score whole sequences
 * with the same parameters, so every GEMM row is the single rank's and only the loss's sum over
 * the ranks is reordered. */
static void test_autocast(void) {
    train_result bf, f32, dp2;
    char err[TRAIN_ERROR_SIZE];
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=1", "model.autocast=bf16"), &bf, err));
    FSDP_TEST_OK(run_sgd(SET("parallel.ranks=1"), &f32, err));
    FSDP_TEST_OK(
        run_sgd(SET("parallel.ranks=2", "parallel.wrap=layer", "model.autocast=bf16"), &dp2, err));
    printf("\n    bf16: probe loss %.7f -> %.7f (f32 %.7f -> %.7f); (2, 1) first %.7f",
           bf.first_loss, bf.last_loss, f32.first_loss, f32.last_loss, dp2.first_loss);
    CU_ASSERT_NOT_EQUAL(bf.first_loss, f32.first_loss);
    CU_ASSERT_TRUE(fabs(bf.first_loss - f32.first_loss) < 1e-2 * f32.first_loss);
    CU_ASSERT_TRUE(bf.last_loss < bf.first_loss);
    CU_ASSERT_TRUE(dp2.last_loss < dp2.first_loss);
    CU_ASSERT_TRUE(fabs(dp2.first_loss - bf.first_loss) <= 1e-5 * bf.first_loss);
    /* (1, 2) tp: o_proj and down_proj (RowwiseParallel) round each rank's partial product to
     * bf16 before the sum over tp, so the numbers differ from one rank's by bf16 roundings, as
     * the f32 run's do (under 1%) */
    train_result tp2;
    FSDP_TEST_OK(
        run_sgd(SET("parallel.ranks=2", "parallel.tp=2", "model.autocast=bf16"), &tp2, err));
    printf("\n    (1, 2) tp: probe loss %.7f -> %.7f", tp2.first_loss, tp2.last_loss);
    CU_ASSERT_TRUE(fabs(tp2.first_loss - bf.first_loss) < 1e-2 * bf.first_loss);
    CU_ASSERT_TRUE(tp2.last_loss < tp2.first_loss);
}

/* More steps: the probe and held-out losses end below the text's unigram entropy. */
static void test_learns(void) {
    train_result res;
    char err[TRAIN_ERROR_SIZE];
    train_tokens t;
    small_config(SET("train.steps=150", "train.eval_every=0", "optim.lr=0.02"));
    FSDP_TEST_OK(train_tokens_load(&g_cfg, &t, err, sizeof err));
    double h = t.entropy;
    train_tokens_free(&t);
    FSDP_TEST_OK(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err));
    printf("\n    unigram entropy %.4f; probe loss %.4f -> %.4f, held-out %.4f", h, res.first_loss,
           res.last_loss, res.eval_loss);
    CU_ASSERT_TRUE(h > 2.0 && h < log(256.0));
    CU_ASSERT_TRUE(res.last_loss < h - 0.5);
    CU_ASSERT_TRUE(res.eval_loss < h - 0.5);
}

/* ---- bad token files --------------------------------------------------------------------- */

/* The small run on a token file written with h (n ids, extra bytes): fails with `want`, and
 * the message names the file and every needle. */
static void refuse(const char *name, header h, int64_t n, int extra, fsdp_status want,
                   const char *const *needles, const char *const *overrides) {
    const char *path = scratch(name);
    char set_path[1300], err[TRAIN_ERROR_SIZE] = "";
    if (n >= 0) CU_ASSERT_TRUE(write_file(path, h, g_ids, n, extra)); /* else: written */
    small_config(overrides);
    snprintf(set_path, sizeof set_path, "data.path=%s", path);
    set(set_path);
    train_result res;
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err);
    CU_ASSERT_EQUAL(st, want);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, path));
    bool all = true;
    for (int i = 0; needles[i]; i++)
        if (!strstr(err, needles[i])) {
            printf("\n    %s: no '%s' in: %s", name, needles[i], err);
            all = false;
        }
    CU_ASSERT_TRUE(all);
    printf("\n    %s: %s", name, err);
}

static void test_bad_files(void) {
    header h = good_header();
    FILE *f = fopen(scratch("short"), "wb"); /* 10 bytes: a header cut short */
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fwrite(TRAIN_TOKENS_MAGIC "\0\1\0", 1, 10, f);
    fclose(f);
    refuse("short", h, -1, 0, FSDP_ERR_CONFIG,
           SET("is 10 bytes", "shorter than the 32-byte header"), NULL);
    header magic = h;
    magic.magic = "GPT2TOK";
    refuse("magic", magic, N_TOKENS, 0, FSDP_ERR_CONFIG,
           SET("magic", "not a token file", "tools/text_to_tokens.py"), NULL);
    header version = h;
    version.version = 2;
    refuse("version", version, N_TOKENS, 0, FSDP_ERR_CONFIG,
           SET("format version 2", "reads version 1"), NULL);
    header bytes = h;
    bytes.bytes = 3;
    refuse("bytes", bytes, N_TOKENS, 0, FSDP_ERR_CONFIG, SET("3 bytes each", "2 (uint16)"), NULL);
    /* truncated: the header says 6000 ids, 5000 follow */
    refuse("truncated", h, 5000, 0, FSDP_ERR_CONFIG,
           SET("says 6000 tokens of 2 bytes", "10000 bytes after", "truncated"), NULL);
    /* a count that the size does not match: one byte too many */
    refuse("count", h, N_TOKENS, 1, FSDP_ERR_CONFIG,
           SET("says 6000 tokens", "12001 bytes after", "1 bytes over"), NULL);
    header huge = h;
    huge.count = UINT64_MAX / 2; /* count * bytes would overflow */
    refuse("count-overflow", huge, N_TOKENS, 0, FSDP_ERR_CONFIG,
           SET("count does not match the size"), NULL);
    /* an id >= vocab_size: in the file (vocab not stated), and the header's vocab */
    header nov = h;
    nov.vocab = 0;
    uint32_t keep777 = g_ids[777], keep5 = g_ids[5];
    g_ids[777] = 300;
    refuse("id", nov, N_TOKENS, 0, FSDP_ERR_CONFIG,
           SET("token 777", "is 300", "[model] vocab_size = 256", "at least 301"), NULL);
    g_ids[777] = keep777;
    refuse("vocab", h, N_TOKENS, 0, FSDP_ERR_CONFIG,
           SET("tokenizer of 256 ids", "[model] vocab_size = 200", "at least 256"),
           SET("model.vocab_size=200"));
    header uint32 = h;
    uint32.bytes = 4;
    uint32.vocab = 70000;
    g_ids[5] = 69999;
    refuse("vocab-u32", uint32, N_TOKENS, 0, FSDP_ERR_CONFIG,
           SET("tokenizer of 70000 ids", "at least 70000"), NULL);
    g_ids[5] = keep5;
    /* too few tokens for a sequence, too few held out for a batch */
    header few = h;
    few.count = 16;
    refuse("few", few, 16, 0, FSDP_ERR_CONFIG, SET("15 training tokens", "max_seq_len + 1 = 17"),
           NULL);
    refuse("held-out", h, N_TOKENS, 0, FSDP_ERR_CONFIG,
           SET("the 60 held-out tokens", "3 sequences", "[data] batch_size = 4"),
           SET("data.eval_fraction=0.01"));
    /* a FIFO: refused before it is opened (which would wait for a writer; the alarm ends the
     * test instead of hanging) */
    unlink(scratch("fifo"));
    CU_ASSERT_EQUAL_FATAL(mkfifo(scratch("fifo"), 0600), 0);
    alarm(120);
    refuse("fifo", h, -1, 0, FSDP_ERR_IO, SET("not a regular file (a FIFO)", "token file"), NULL);
    alarm(0);
    /* a file that is not there */
    small_config(SET("data.path=/nonexistent/x.tok"));
    char err[TRAIN_ERROR_SIZE];
    train_result res;
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err), FSDP_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot open token file '/nonexistent/x.tok'"));
    /* the same file as uint32 trains as the uint16 one: bitwise the same losses. Its header
     * says 70000 ids (a tokenizer past uint16), so the model has 70000. Under ThreadSanitizer
     * the header says 256 and the model keeps its 256: the same reads of 4-byte ids and the
     * same threads, without the two 70000-id runs (some 16 s of the suite there); the
     * Release and ASan builds run them. */
#ifdef UNDER_TSAN
    uint32.vocab = 256;
    const char *vocab = "model.vocab_size=256";
#else
    const char *vocab = "model.vocab_size=70000";
#endif
    train_result a, b;
    FSDP_TEST_OK(run_small(SET("train.steps=3"), &a, err));
    CU_ASSERT_TRUE(write_file(scratch("u32"), uint32, g_ids, N_TOKENS, 0));
    char p[1300];
    snprintf(p, sizeof p, "data.path=%s", scratch("u32"));
    FSDP_TEST_OK(run_small(SET("train.steps=3", vocab, p), &b, err));
    FSDP_TEST_OK(run_small(SET("train.steps=3", vocab), &a, err));
    CU_ASSERT_EQUAL(a.step_loss[2], b.step_loss[2]);
    CU_ASSERT_EQUAL(a.last_loss, b.last_loss);
}

/* ---- configuration ----------------------------------------------------------------------- */

/* A config file: its line is named in the message. */
static void config_refused(const char *text, const char *const *needles) {
    const char *path = scratch("run.ini");
    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    fsdp_status st = train_config_load(&g_cfg, path, err, sizeof err);
    if (st == FSDP_OK) st = train_config_check(&g_cfg, err, sizeof err);
    CU_ASSERT_EQUAL(st, FSDP_ERR_CONFIG);
    bool all = true;
    for (int i = 0; needles[i]; i++)
        if (!strstr(err, needles[i])) {
            printf("\n    no '%s' in: %s", needles[i], err);
            all = false;
        }
    CU_ASSERT_TRUE(all);
    printf("\n    %s", err);
}

#define LLAMA  "[model]\nkind = llama\n"
#define TOKENS "[data]\nkind = tokens\npath = x.tok\n"

static void test_config_errors(void) {
    config_refused(LLAMA "n_heads = 4\nn_kv_heads = 3\n" TOKENS,
                   SET("[model] n_kv_heads = 3 (", "run.ini:4)", "must divide [model] n_heads = 4",
                       "use a divisor of 4"));
    config_refused(LLAMA "dim = 48\nn_heads = 5\n" TOKENS,
                   SET("[model] n_heads = 5", "run.ini:4", "dim = 48", "not an integer"));
    config_refused(LLAMA "dim = 36\nn_heads = 4\n" TOKENS, SET("n_heads = 4", "odd", "even"));
    config_refused(LLAMA "dim = 96\nn_heads = 6\n[parallel]\nranks = 4\ntp = 4\n" TOKENS,
                   SET("[parallel] tp = 4", "run.ini:7", "[model] n_heads = 6", "query heads",
                       "use a tp that divides 6"));
    config_refused(LLAMA "n_heads = 4\nn_kv_heads = 1\n[parallel]\ntp = 2\n" TOKENS,
                   SET("[parallel] tp = 2", "[model] n_kv_heads = 1", "key/value heads"));
    config_refused(LLAMA "ffn_hidden = 66\n[parallel]\ntp = 4\n" TOKENS,
                   SET("[parallel] tp = 4", "[model] ffn_hidden = 66", "66 SwiGLU width"));
    config_refused(LLAMA "widths = 8,8\n" TOKENS,
                   SET("[model] widths = 8,8", "run.ini:3", "applies to kind = mlp"));
    config_refused("[model]\ndim = 32\n",
                   SET("[model] dim = 32", "run.ini:2", "applies to kind = llama"));
    config_refused(LLAMA, SET("[model] kind = llama (", "run.ini:2)", "set [data] kind = tokens"));
    config_refused(TOKENS, SET("[data] kind = tokens (", "run.ini:2)", "set [model] kind = llama"));
    config_refused(LLAMA "[data]\nkind = tokens\n", SET("needs [data] path", "token file"));
    config_refused(LLAMA TOKENS "shuffle = true\n", SET("[data] shuffle = true (", "run.ini:6)",
                                                        "applies to kind = synthetic or h5"));
    config_refused(LLAMA TOKENS "task = classification\n", SET("[data] task", "run.ini:6)"));
    config_refused("[data]\neval_batches = 3\n", SET("[data] eval_batches = 3", "kind = tokens"));
    config_refused(LLAMA TOKENS "batch_size = 6\n[parallel]\nranks = 4\n",
                   SET("[data] batch_size = 6 (", "run.ini:6)", "4 data-parallel ranks",
                       "use a multiple of 4"));
    config_refused(LLAMA "n_layers = 3\ncheckpoint_activations = model.layers.0,layers.*\n" TOKENS,
                   SET("run.ini:4", "pattern 'layers.*' matches no decoder layer",
                       "model.layers.0 to model.layers.2", "model.layers.*"));
    config_refused(LLAMA TOKENS "batch_size = 12\n[parallel]\nranks = 4\n[train]\ngrad_accum = 2\n",
                   SET("[data] batch_size = 12 (", "in micro-batches of 6",
                       "[train] grad_accum = 2", "use a multiple of 8"));
    config_refused(LLAMA "norm = rmsnorm\n" TOKENS,
                   SET("[model] norm = rmsnorm", "applies to kind = mlp"));
    config_refused(LLAMA "n_kv_heads = 1\n" TOKENS "[parallel]\ntp = 2\nranks = 4\nwrap = layer\n",
                   SET("[parallel] tp = 2", "n_kv_heads = 1"));
}

/* ---- resume ------------------------------------------------------------------------------ */

static fsdp_status run_ckpt(const char *dir, const char *const *optim, const char *const *overrides,
                            const char *steps, train_result *res) {
    char d[1400], err[TRAIN_ERROR_SIZE];
    small_config_with(optim, overrides);
    snprintf(d, sizeof d, "checkpoint.dir=%s", dir);
    set(d);
    set(steps);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, res, err, sizeof err);
    if (st != FSDP_OK) printf("\n    train_run: %s", err);
    return st;
}

/* 10 steps against 5, a stop, and 5 resumed: at the same layout bitwise under AdamW (step
 * losses, probe and held-out losses, every tensor of the last checkpoint, Adam's moments
 * included); at another to float32 rounding, under SGD (RTOL). */
static void resume_case(const char *name, const char *const *first, const char *const *second,
                        bool bitwise) {
    char a_dir[1200], b_dir[1300];
    snprintf(a_dir, sizeof a_dir, "%s", scratch(name));
    snprintf(b_dir, sizeof b_dir, "%s-b", a_dir);
    train_result a, b1, b2;
    const char *const *optim = bitwise ? NULL : g_sgd;
    FSDP_TEST_OK(run_ckpt(a_dir, optim, second, "train.steps=10", &a));
    FSDP_TEST_OK(run_ckpt(b_dir, optim, first, "train.steps=5", &b1));
    FSDP_TEST_OK(run_ckpt(b_dir, optim, second, "train.steps=10", &b2));
    CU_ASSERT_EQUAL(b2.start_step, 5);
    CU_ASSERT_EQUAL_FATAL(b2.n_step_losses, 5);
    CU_ASSERT_PTR_NOT_NULL(strstr(b2.resumed_from, "step-00000005"));
    double worst = 0;
    for (int i = 0; i < 5; i++)
        worst = fmax(worst, fabs(b2.step_loss[i] - a.step_loss[5 + i]) / a.step_loss[5 + i]);
    worst = fmax(worst, fabs(b2.last_loss - a.last_loss) / a.last_loss);
    worst = fmax(worst, fabs(b2.eval_loss - a.eval_loss) / a.eval_loss);
    printf("\n    %-36s resumed losses: max rel diff %.1e", name, worst);
    if (bitwise) {
        CU_ASSERT_EQUAL(worst, 0);
        char pa[1400], pb[1400];
        snprintf(pa, sizeof pa, "%s/step-00000010", a_dir);
        snprintf(pb, sizeof pb, "%s/step-00000010", b_dir);
        bool same = ckpt_test_same(pa, pb, -1, 0, name);
        CU_ASSERT_TRUE(same);
        printf("; checkpoints of step 10 (parameters, Adam's moments) %s",
               same ? "bitwise equal" : "DIFFER");
    } else {
        CU_ASSERT_TRUE(worst <= RTOL);
    }
}

static void test_resume(void) {
    resume_case("resume-1x1", SET("parallel.ranks=1"), SET("parallel.ranks=1"), true);
    const char *const *l22 = SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer",
                                 "model.checkpoint_activations=model.layers.*");
    resume_case("resume-2x2", l22, l22, true);
    resume_case("resume-2x2-to-1x2", l22, SET("parallel.ranks=2", "parallel.tp=2"), false);
}

/* ---- export to Hugging Face ------------------------------------------------------------- */

/* A run's checkpoint carries the model's config.json (fsdp_ckpt_model_config), which reads
 * back as the [model] keys; fsdp_ckpt_export_hf writes it as a model directory, and importing
 * that directory gives every parameter of the checkpoint bitwise. */
static void hf_export_case(const char *name, const char *const *overrides, bool tied) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    train_result res;
    char dir[1200], step[1300], hf[1300], back[1300];
    snprintf(dir, sizeof dir, "%s", scratch(name));
    FSDP_TEST_OK(run_ckpt(dir, NULL, overrides, "train.steps=3", &res));
    snprintf(step, sizeof step, "%s/step-00000003", dir);
    snprintf(hf, sizeof hf, "%s-hf", dir);
    snprintf(back, sizeof back, "%s-back", dir);
    fsdp_ckpt *ck = NULL, *imp = NULL;
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, step, &ck));
    if (!ck) return;
    const char *json = fsdp_ckpt_model_config(ck);
    CU_ASSERT_PTR_NOT_NULL_FATAL(json);
    fsdp_llama_config got, want = train_llama_config(&g_cfg), want_r;
    FSDP_TEST_OK(fsdp_llama_config_from_hf_json(ctx, json, &got));
    FSDP_TEST_OK(fsdp_llama_config_resolve(ctx, &want, &want_r));
    CU_ASSERT_EQUAL(got.dim, want_r.dim);
    CU_ASSERT_EQUAL(got.n_layers, want_r.n_layers);
    CU_ASSERT_EQUAL(got.n_heads, want_r.n_heads);
    CU_ASSERT_EQUAL(got.n_kv_heads, want_r.n_kv_heads);
    CU_ASSERT_EQUAL(got.vocab_size, want_r.vocab_size);
    CU_ASSERT_EQUAL(got.ffn_hidden, want_r.ffn_hidden);
    CU_ASSERT_EQUAL(got.max_seq_len, want_r.max_seq_len);
    CU_ASSERT_EQUAL(got.norm_eps, want_r.norm_eps);
    CU_ASSERT_EQUAL(got.rope_theta, want_r.rope_theta);
    CU_ASSERT_EQUAL(got.tie_word_embeddings, tied);
    FSDP_TEST_OK(fsdp_ckpt_export_hf(ctx, ck, hf, NULL));
    FSDP_TEST_OK(fsdp_ckpt_import(ctx, hf, back, NULL));
    snprintf(back + strlen(back), sizeof back - strlen(back), "/step-00000000");
    FSDP_TEST_OK(fsdp_ckpt_open(ctx, back, &imp));
    int n = imp ? fsdp_ckpt_num_tensors(imp) : 0, same = 0;
    for (int t = 0; t < n; t++) {
        fsdp_ckpt_tensor a, b;
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, imp, t, &a));
        int u = fsdp_ckpt_find(ck, a.name);
        CU_ASSERT_TRUE_FATAL(u >= 0);
        FSDP_TEST_OK(fsdp_ckpt_tensor_get(ctx, ck, u, &b));
        fsdp_state_region all = {.ndim = a.ndim};
        int64_t count = 1;
        for (int d = 0; d < a.ndim; d++) count *= all.count[d] = a.shape[d];
        float *va = malloc((size_t)count * 4), *vb = malloc((size_t)count * 4);
        FSDP_TEST_OK(fsdp_ckpt_read(ctx, imp, t, &all, va));
        FSDP_TEST_OK(fsdp_ckpt_read(ctx, ck, u, &all, vb));
        bool eq = memcmp(va, vb, (size_t)count * 4) == 0;
        if (!eq) printf("\n    %s differs after export and import", a.name);
        same += eq;
        free(va);
        free(vb);
    }
    /* 2 layers of 9 tensors, the embedding, the final norm and (untied) lm_head */
    CU_ASSERT_EQUAL(n, 2 * 9 + (tied ? 2 : 3));
    CU_ASSERT_EQUAL(fsdp_ckpt_find(imp, "lm_head.weight") >= 0, !tied);
    CU_ASSERT_EQUAL(same, n);
    printf("\n    %s: step 3's config.json reads back as the [model] keys; %d of %d parameters "
           "bitwise after export --format hf and import",
           name, same, n);
    fsdp_ckpt_close(imp);
    fsdp_ckpt_close(ck);
}

static void test_hf_export(void) {
    hf_export_case("hf-run", SET("parallel.ranks=2", "parallel.tp=2"), false);
}

/* ---- [model] init = a Hugging Face directory ---------------------------------------------- */

#define HF_INIT_DIR FSDP_FIXTURE_DIR "/hf_llama_init"

/* The configuration of a run from tests/fixtures/hf_llama_init (tools/gen_hf_init_fixture.py):
 * no shape key, the probe sequences of its token file as the one batch of the first loss. */
static void hf_init_config(const char *tokens, const char *init, const char *const *overrides) {
    char path[1300], key[1300];
    static const char *const base[] = {
        "model.kind=llama",       "data.kind=tokens",     "data.batch_size=4",
        "data.eval_batches=1",    "data.eval_fraction=0", "optim.name=sgd",
        "optim.lr=0.01",          "train.steps=1",        "log.level=off",
        "parallel.backend=local", "parallel.timeout_s=60"};
    train_config_init(&g_cfg);
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) set(base[i]);
    snprintf(path, sizeof path, "data.path=%s", tokens);
    set(path);
    snprintf(key, sizeof key, "model.init=%s", init);
    set(key);
    for (int i = 0; overrides && overrides[i]; i++) set(overrides[i]);
}

/* A run refused before training with FSDP_ERR_CONFIG, its message holding every needle. */
static void hf_init_refused(const char *tokens, const char *init, const char *const *overrides,
                            const char *const *needles) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_result res;
    hf_init_config(tokens, init, overrides);
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_CONFIG);
    bool all = true;
    for (int i = 0; needles[i]; i++) all = all && strstr(err, needles[i]) != NULL;
    CU_ASSERT_TRUE(all);
    printf("\n    %s: %s", overrides && overrides[0] ? overrides[0] : init, err);
}

/* A copy of the fixture's config.json in dir with `from` replaced by `to` (config.json only:
 * the run is refused before the weights are read). */
static void edited_config(const char *dir, const char *from, const char *to) {
    char path[1300];
    mkdir(dir, 0700);
    FILE *f = fopen(HF_INIT_DIR "/config.json", "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, from);
    CU_ASSERT_PTR_NOT_NULL_FATAL(at);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *o = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    fprintf(o, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    fclose(o);
}

/* tests/fixtures/hf_llama_tied: transformers' save of a tied model (no lm_head.weight in its
 * model.safetensors) as [model] init: tie_embeddings comes from config.json, the import needs
 * no lm_head.weight, and the first loss is transformers' (the bound of test_hf_init). */
static void hf_init_tied(void) {
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named("hf_llama_tied", &fx), 0);
    const fixture_tensor *tok = fixture_require(&fx, "tokens", FIXTURE_I32);
    const fixture_tensor *loss = fixture_require(&fx, "loss", FIXTURE_F64);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tok);
    CU_ASSERT_PTR_NOT_NULL_FATAL(loss);
    uint32_t *ids = malloc((size_t)tok->numel * sizeof *ids);
    for (int64_t i = 0; i < tok->numel; i++) ids[i] = (uint32_t)((int32_t *)tok->data)[i];
    char tokens[1200], err[TRAIN_ERROR_SIZE] = "";
    snprintf(tokens, sizeof tokens, "%s", scratch("hf_tied.tok"));
    CU_ASSERT_TRUE_FATAL(write_file(
        tokens, (header){TRAIN_TOKENS_MAGIC, 1, 2, (uint64_t)tok->numel, 64}, ids, tok->numel, 0));
    free(ids);
    bool changed = false;
    hf_init_config(tokens, FSDP_FIXTURE_DIR "/hf_llama_tied", NULL);
    FSDP_TEST_OK(train_config_adopt_init(&g_cfg, &changed, err, sizeof err));
    CU_ASSERT_TRUE(g_cfg.model.tie_embeddings);
    train_result res;
    hf_init_config(tokens, FSDP_FIXTURE_DIR "/hf_llama_tied", NULL);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err);
    FSDP_TEST_OK(st);
    if (st != FSDP_OK) printf("\n    train_run: %s", err);
    double want = *(double *)loss->data, tol = fsdp_test_sum_tol(64, 22) * fabs(want);
    CU_ASSERT_TRUE(fabs(res.first_loss - want) <= tol);
    printf("\n    tied: first loss %.7f, transformers' %.7f (|diff| %.2g, bound %.2g)",
           res.first_loss, want, fabs(res.first_loss - want), tol);
    hf_init_refused(tokens, FSDP_FIXTURE_DIR "/hf_llama_tied", SET("model.tie_embeddings=false"),
                    (const char *const[]){"[model] tie_embeddings = false",
                                          "tie_word_embeddings = true", NULL});
    fixture_free(&fx);
}

/* dir/config.json: the fixture's shape with Llama 3.2's rope scaling of rope_type `type`. */
static void write_rope_config(const char *dir, const char *type) {
    char path[1300];
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fprintf(f,
            "{\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 2,"
            " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 64,"
            " \"intermediate_size\": 48, \"max_position_embeddings\": 16,"
            " \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"rope_scaling\":"
            " {\"rope_type\": \"%s\", \"factor\": 32.0, \"low_freq_factor\": 1.0,"
            " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}\n",
            type);
    fclose(f);
}

/* Llama 3's rope_scaling comes with the shape: the five rope keys take it, the configuration's
 * model writes it back into config.json, a rope_scaling = none set against it and a yarn
 * scaling are refused. */
static void hf_init_rope3(const char *tokens) {
    char dir[1200], err[TRAIN_ERROR_SIZE] = "";
    bool changed = false;
    snprintf(dir, sizeof dir, "%s", scratch("hf_rope3"));
    write_rope_config(dir, "llama3");
    hf_init_config(tokens, dir, NULL);
    FSDP_TEST_OK(train_config_adopt_init(&g_cfg, &changed, err, sizeof err));
    CU_ASSERT_EQUAL(g_cfg.model.rope_scaling, 1);
    CU_ASSERT_EQUAL((float)g_cfg.model.rope_factor, 32.0f);
    CU_ASSERT_EQUAL((float)g_cfg.model.rope_low_freq_factor, 1.0f);
    CU_ASSERT_EQUAL((float)g_cfg.model.rope_high_freq_factor, 4.0f);
    CU_ASSERT_EQUAL(g_cfg.model.rope_original_max_len, 8192);
    CU_ASSERT_EQUAL((float)g_cfg.model.rope_theta, 500000.0f);
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_llama_config lc = train_llama_config(&g_cfg), back;
    char *json = NULL;
    FSDP_TEST_OK(fsdp_llama_config_to_hf_json(ctx, &lc, &json));
    FSDP_TEST_OK(fsdp_llama_config_from_hf_json(ctx, json ? json : "", &back));
    CU_ASSERT_TRUE(json && strstr(json, "\"rope_type\": \"llama3\""));
    CU_ASSERT_EQUAL(back.rope_scaling.type, FSDP_LLAMA_ROPE_LLAMA3);
    CU_ASSERT_EQUAL(back.rope_scaling.factor, 32.0f);
    CU_ASSERT_EQUAL(back.rope_scaling.low_freq_factor, 1.0f);
    CU_ASSERT_EQUAL(back.rope_scaling.high_freq_factor, 4.0f);
    CU_ASSERT_EQUAL(back.rope_scaling.original_max_len, 8192);
    free(json);
    hf_init_refused(
        tokens, dir, SET("model.rope_scaling=none"),
        (const char *const[]){"[model] rope_scaling = none", "rope_scaling = llama3", NULL});
    snprintf(dir, sizeof dir, "%s", scratch("hf_yarn"));
    write_rope_config(dir, "yarn");
    hf_init_refused(
        tokens, dir, NULL,
        (const char *const[]){"\"rope_scaling\".\"rope_type\" is \"yarn\"", "\"llama3\"", NULL});
}

/* [model] init = a Hugging Face directory gives the shape: the keys take config.json's values
 * (and say so as their origin); training starts from its weights: the first loss is
 * transformers' on the same sequences; a key set otherwise, a max_seq_len beyond
 * max_position_embeddings and unsupported features are refused naming both sides. */
static void test_hf_init(void) {
    fixture fx;
    CU_ASSERT_EQUAL_FATAL(fixture_load_named("hf_llama_init", &fx), 0);
    const fixture_tensor *tok = fixture_require(&fx, "tokens", FIXTURE_I32);
    const fixture_tensor *loss = fixture_require(&fx, "loss", FIXTURE_F64);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tok);
    CU_ASSERT_PTR_NOT_NULL_FATAL(loss);
    uint32_t *ids = malloc((size_t)tok->numel * sizeof *ids);
    for (int64_t i = 0; i < tok->numel; i++) ids[i] = (uint32_t)((int32_t *)tok->data)[i];
    char tokens[1200], err[TRAIN_ERROR_SIZE] = "";
    snprintf(tokens, sizeof tokens, "%s", scratch("hf_init.tok"));
    CU_ASSERT_TRUE_FATAL(write_file(
        tokens, (header){TRAIN_TOKENS_MAGIC, 1, 2, (uint64_t)tok->numel, 64}, ids, tok->numel, 0));
    free(ids);

    /* the shape, from config.json */
    hf_init_config(tokens, HF_INIT_DIR, NULL);
    bool changed = false;
    FSDP_TEST_OK(train_config_adopt_init(&g_cfg, &changed, err, sizeof err));
    CU_ASSERT_TRUE(changed);
    CU_ASSERT_EQUAL(g_cfg.model.dim, 32);
    CU_ASSERT_EQUAL(g_cfg.model.n_layers, 2);
    CU_ASSERT_EQUAL(g_cfg.model.n_heads, 4);
    CU_ASSERT_EQUAL(g_cfg.model.n_kv_heads, 2);
    CU_ASSERT_EQUAL(g_cfg.model.vocab_size, 64);
    CU_ASSERT_EQUAL(g_cfg.model.ffn_hidden, 48);
    CU_ASSERT_EQUAL(g_cfg.model.max_seq_len, 16);
    CU_ASSERT_EQUAL((float)g_cfg.model.norm_eps, 1e-5f);
    CU_ASSERT_EQUAL((float)g_cfg.model.rope_theta, 5000.0f);
    const char *origin = train_config_origin(&g_cfg, "model", "dim");
    CU_ASSERT_TRUE(origin && strstr(origin, "config.json, hidden_size"));
    FSDP_TEST_OK(train_config_adopt_init(&g_cfg, &changed, err, sizeof err)); /* again: agrees */
    CU_ASSERT_FALSE(changed);
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));

    /* training starts from its weights. |got - want| <= TOL x want: both compute the loss in
     * float32 in other orders; the sums have at most 64 terms (the softmax over the vocabulary;
     * dim 32, ffn 48, 16 positions) through about 22 operations forward (test_llama.c's
     * count, the same shape), so fsdp_test_sum_tol(64, 22) bounds the relative error. */
    train_result res;
    hf_init_config(tokens, HF_INIT_DIR, NULL);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err);
    FSDP_TEST_OK(st);
    if (st != FSDP_OK) printf("\n    train_run: %s", err);
    double want = *(double *)loss->data, tol = fsdp_test_sum_tol(64, 22) * fabs(want);
    CU_ASSERT_TRUE(fabs(res.first_loss - want) <= tol);
    printf("\n    first loss %.7f, transformers' %.7f (|diff| %.2g, bound %.2g)", res.first_loss,
           want, fabs(res.first_loss - want), tol);
    /* a key set to the same value, and a shorter max_seq_len, are taken */
    hf_init_config(tokens, HF_INIT_DIR, SET("model.dim=32", "model.max_seq_len=8"));
    FSDP_TEST_OK(train_config_adopt_init(&g_cfg, &changed, err, sizeof err));
    CU_ASSERT_EQUAL(g_cfg.model.max_seq_len, 8);

    /* disagreements and what the model does not build, refused naming both sides */
    hf_init_refused(tokens, HF_INIT_DIR, SET("model.dim=64"),
                    (const char *const[]){"[model] dim = 64 (--set model.dim=64)",
                                          "hidden_size = 32", "hf_llama_init/config.json",
                                          "[model] init =", NULL});
    hf_init_refused(
        tokens, HF_INIT_DIR, SET("model.n_kv_heads=4"),
        (const char *const[]){"[model] n_kv_heads = 4", "num_key_value_heads = 2", NULL});
    hf_init_refused(tokens, HF_INIT_DIR, SET("model.rope_theta=10000"),
                    (const char *const[]){"[model] rope_theta = 10000", "rope_theta = 5000", NULL});
    hf_init_refused(
        tokens, HF_INIT_DIR, SET("model.max_seq_len=32"),
        (const char *const[]){"[model] max_seq_len = 32", "max_position_embeddings = 16", NULL});
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", scratch("hf_bias"));
    edited_config(dir, "\"attention_bias\": false", "\"attention_bias\": true");
    hf_init_refused(tokens, dir, NULL,
                    (const char *const[]){"[model] init", "\"attention_bias\"", "no biases", NULL});
    snprintf(dir, sizeof dir, "%s", scratch("hf_type"));
    edited_config(dir, "\"model_type\": \"llama\"", "\"model_type\": \"mistral\"");
    hf_init_refused(tokens, dir, NULL,
                    (const char *const[]){"\"model_type\" is \"mistral\"", "\"llama\"", NULL});
    snprintf(dir, sizeof dir, "%s", scratch("hf_huge"));
    edited_config(dir, "\"hidden_size\": 32", "\"hidden_size\": 1099511627776");
    hf_init_refused(
        tokens, dir, NULL,
        (const char *const[]){"\"hidden_size\" is 1099511627776", "1 .. 1048576", NULL});
    hf_init_rope3(tokens);
    hf_init_tied();
    fixture_free(&fx);
}

/* ---- the example -------------------------------------------------------------------------- */

/* examples/llama-austen.ini checks out, and its token file loads: byte tokens, entropy ~3.09. */
static void test_example(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    FSDP_TEST_OK(
        train_config_load(&g_cfg, FSDP_SOURCE_DIR "/examples/llama-austen.ini", err, sizeof err));
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
    CU_ASSERT_EQUAL(g_cfg.model.kind, TRAIN_MODEL_LLAMA);
    set("data.path=" FSDP_SOURCE_DIR "/examples/data/austen-pride.tok");
    train_tokens t;
    FSDP_TEST_OK(train_tokens_load(&g_cfg, &t, err, sizeof err));
    printf("\n    %lld tokens, unigram entropy %.4f", (long long)t.count, t.entropy);
    CU_ASSERT_TRUE(t.count > 600000);
    CU_ASSERT_TRUE(fabs(t.entropy - 3.09) < 0.01);
    train_tokens_free(&t);
}

/* examples/llama-gpu.ini: the GPU example's settings, valid with its device on sim (no GPU
 * here), and shrunk (2 layers of dim 64, sequences of 32, its other keys as they are) it trains 4
 * steps there under its bf16 policy, TF32 switch and FSDP unit per layer, with a finite
 * held-out loss and a checkpoint. Its full size is timed where a GPU is (docs/train.md). */
static void test_example_gpu(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    FSDP_TEST_OK(
        train_config_load(&g_cfg, FSDP_SOURCE_DIR "/examples/llama-gpu.ini", err, sizeof err));
    CU_ASSERT_TRUE(g_cfg.parallel.device == FSDP_DEVICE_CUDA && g_cfg.parallel.allow_tf32 &&
                   g_cfg.model.autocast == 1 && g_cfg.model.dim == 768 &&
                   g_cfg.model.n_layers == 12 && g_cfg.model.max_seq_len == 1024);
    set("parallel.device=sim");
    set("data.path=" FSDP_SOURCE_DIR "/examples/data/austen-pride.tok");
    FSDP_TEST_OK(train_config_check(&g_cfg, err, sizeof err));
    if (err[0]) printf("\n    %s", err);
    static const char *const shrink[] = {
        "model.dim=64",       "model.n_layers=2",     "model.n_heads=4",
        "model.n_kv_heads=2", "model.ffn_hidden=128", "model.max_seq_len=32",
        "train.steps=4",      "train.log_every=2",    "train.eval_every=4",
        "checkpoint.every=4", "optim.warmup_steps=1", "log.metrics="};
    for (size_t i = 0; i < sizeof shrink / sizeof shrink[0]; i++) set(shrink[i]);
    char dir[1200];
    snprintf(dir, sizeof dir, "checkpoint.dir=%s", scratch("example-gpu"));
    set(dir);
    train_result res;
    FSDP_TEST_OK(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err));
    if (err[0]) printf("\n    %s", err);
    printf("\n    shrunk on sim: loss %.4f -> %.4f, held-out %.4f", res.first_loss, res.last_loss,
           res.eval_loss);
    CU_ASSERT_EQUAL(res.steps, 4);
    CU_ASSERT_TRUE(isfinite(res.last_loss) && isfinite(res.eval_loss) && res.saved[0]);
}

static int setup(void) {
    char tmpl[] = "/tmp/test_train_llama-XXXXXX";
    if (!mkdtemp(tmpl)) return -1;
    g_root = strdup(tmpl);
    make_text();
    snprintf(g_tokens, sizeof g_tokens, "%s/good.tok", g_root);
    return write_file(g_tokens, good_header(), g_ids, N_TOKENS, 0) ? 0 : -1;
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"layouts", test_layouts},
        {"uneven_vocab", test_uneven_vocab},
        {"rope_scaling", test_rope_scaling},
        {"tied", test_tied},
        {"autocast", test_autocast},
        {"learns", test_learns},
        {"bad_files", test_bad_files},
        {"config_errors", test_config_errors},
        {"resume", test_resume},
        {"hf_export", test_hf_export},
        {"hf_init", test_hf_init},
        {"example", test_example},
        {"example_gpu", test_example_gpu},
    };
    if (setup() != 0) return 2;
    int rc = fsdp_test_run(argc, argv, "train_llama", cases, (int)(sizeof cases / sizeof cases[0]));
    ckpt_test_remove_tree(g_root);
    free(g_root);
    return rc;
}
