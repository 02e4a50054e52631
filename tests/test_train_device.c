/* test_train_device.c: fsdp-train's [parallel] device (train_run, the loop the tool runs): the
 * MLP and the Llama at (dp, tp) = (2, 2), FSDP per layer after TP (the 2-D layout), and at
 * (2, 1) under FULL_SHARD, on `sim` devices (deferred streams, two devices shared by the rank
 * threads) give the CPU run's step losses, dataset losses, evaluation, comm-debug table and
 * final checkpoint bit for bit; the progress lines and metrics records name the device (and
 * the CPU run's do not); an unknown device, cuda without a GPU and a device under the mpi
 * backend are refused naming the key and the fix, and so are the rules of backend = nccl.
 *
 * With FSDP_TEST_BACKEND=nccl (CTest's test_train_device_nccl) it runs [parallel] backend =
 * nccl instead: the stand-in NCCL opened through FSDP_NCCL_LIBRARY alone (its marker makes it
 * the library of sim devices), one sim device per rank (FSDP_SIM_DEVICES=4), the MLP and the
 * Llama at (2, 2) against the local backend's cpu run, bit for bit: every group has 2 ranks, and
 * a sum of two terms is the same in either order. */
#define _POSIX_C_SOURCE 200809L // setenv, open_memstream

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_common.h" // defines: ckpt_test_tmp_root, ckpt_test_remove_tree, ckpt_test_compare
#include "harness.h"
#include "shell.h"        // defines: fsdp_test_shell
#include "train_config.h" // defines: train_config_init, train_config_set, train_config_check
#include "train_tokens.h" // defines: TRAIN_TOKENS_MAGIC, TRAIN_TOKENS_HEADER
#include "trainer.h"      // defines: train_run

static train_config g_cfg; /* large: keep it off the stack */
static char *g_root;       /* this run's scratch directory */
static char g_tokens[1100];
static bool g_nccl;       /* FSDP_TEST_BACKEND=nccl: the sim runs are on backend = nccl */
static int g_sim_devices; /* FSDP_SIM_DEVICES of this run */

#define SET(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The MLP of test_train (Linear(8, 16), relu, Linear(16, 16), relu, Linear(16, 4)), AdamW with
 * clipping, 6 steps: small enough for two cores, long enough for the optimizer state to count. */
static const char *const g_mlp[] = {
    "model.widths=8,16,16,4", "data.samples=64",  "data.batch_size=8",
    "data.teacher_widths=16", "optim.name=adamw", "optim.lr=0.01",
    "optim.clip_grad_norm=1", "train.steps=6",    NULL};

/* A tiny Llama (test_train_llama's, one layer fewer steps): 2 layers of dim 32, 4 query and 2
 * key/value heads, sequences of 16, 4 per batch, 4 AdamW steps with clipping, an evaluation
 * at the end over 2 held-out batches. */
static const char *const g_llama[] = {
    "model.kind=llama",   "model.dim=32",           "model.n_layers=2",     "model.n_heads=4",
    "model.n_kv_heads=2", "model.ffn_hidden=64",    "model.max_seq_len=16", "data.kind=tokens",
    "data.batch_size=4",  "data.eval_fraction=0.1", "data.eval_batches=2",  "optim.name=adamw",
    "optim.lr=0.01",      "optim.clip_grad_norm=1", "train.steps=4",        NULL};

/* Every run: rank threads, progress and comm-debug table on, a record every 2 steps. */
static const char *const g_common[] = {"parallel.backend=local", "parallel.timeout_s=120",
                                       "log.level=info",         "log.comm_debug=true",
                                       "train.log_every=2",      NULL};

static void set(const char *assignment) {
    char err[TRAIN_ERROR_SIZE] = "";
    FSDP_TEST_OK(train_config_set(&g_cfg, assignment, err, sizeof err));
    if (err[0]) printf("\n    %s", err);
}

static void setf(const char *key, const char *value) {
    char a[1400];
    snprintf(a, sizeof a, "%s=%s", key, value);
    set(a);
}

/* The run's configuration; dir and metrics may be NULL (none), layout may set them again. */
static void configure(const char *const *model, const char *const *layout, const char *device,
                      const char *dir, const char *metrics) {
    train_config_init(&g_cfg);
    for (int i = 0; g_common[i]; i++) set(g_common[i]);
    for (int i = 0; model[i]; i++) set(model[i]);
    if (model == g_llama) setf("data.path", g_tokens);
    if (dir) setf("checkpoint.dir", dir);
    if (metrics) setf("log.metrics", metrics);
    for (int i = 0; layout[i]; i++) set(layout[i]);
    setf("parallel.device", device);
}

/* One run's results. */
typedef struct run_out {
    train_result res;
    char *text;       /* the progress output (malloc'ed) */
    char *metrics;    /* the metrics file's text (malloc'ed) */
    char dir[1200];   /* [checkpoint] dir */
    char table[4096]; /* the comm_debug table's lines */
} run_out;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *text = calloc(1, 1 << 20);
    if (f && text) text[fread(text, 1, (1 << 20) - 1, f)] = '\0';
    if (f) fclose(f);
    return text;
}

/* The lines of out from "comm_debug:" up to the next progress, eval or checkpoint line. */
static void comm_table(const char *out, char *table, size_t size) {
    table[0] = '\0';
    const char *p = out ? strstr(out, "comm_debug:") : NULL;
    size_t n = 0;
    while (p && *p && strncmp(p, "step ", 5) != 0 && strncmp(p, "eval ", 5) != 0 &&
           strncmp(p, "checkpoint", 10) != 0) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) + 1 : strlen(p);
        if (n + len < size) memcpy(table + n, p, len), n += len, table[n] = '\0';
        p += len;
    }
}

static fsdp_status run(const char *name, const char *const *model, const char *const *layout,
                       const char *device, run_out *o) {
    char err[TRAIN_ERROR_SIZE] = "", metrics[1200];
    snprintf(o->dir, sizeof o->dir, "%s/%s-%s", g_root, name, device);
    snprintf(metrics, sizeof metrics, "%s/%s-%s.jsonl", g_root, name, device);
    configure(model, layout, device, o->dir, metrics);
    if (g_nccl && strcmp(device, "sim") == 0) set("parallel.backend=nccl");
    size_t size = 0;
    FILE *f = open_memstream(&o->text, &size);
    fsdp_status st = train_run(fsdp_test_ctx(), &g_cfg, f, &o->res, err, sizeof err);
    fclose(f);
    if (st != FSDP_OK) printf("\n    %s on %s: %s", name, device, err);
    o->metrics = slurp(metrics);
    comm_table(o->text, o->table, sizeof o->table);
    return st;
}

static bool same_bits(const void *a, const void *b, size_t n) {
    return memcmp(a, b, n) == 0;
}

/* The run on cpu and on sim: every loss, the comm-debug table and the final checkpoint bit for
 * bit; the device in the sim run's lines and records only. */
static void cpu_against_sim(const char *name, const char *const *model, const char *const *layout) {
    run_out c = {0}, s = {0};
    FSDP_TEST_OK(run(name, model, layout, "cpu", &c));
    FSDP_TEST_OK(run(name, model, layout, "sim", &s));
    CU_ASSERT_EQUAL(c.res.steps, s.res.steps);
    CU_ASSERT_TRUE(c.res.n_step_losses > 0 && c.res.n_step_losses == s.res.n_step_losses);
    bool losses =
        c.res.n_step_losses == s.res.n_step_losses &&
        same_bits(c.res.step_loss, s.res.step_loss, (size_t)c.res.n_step_losses * sizeof(double));
    CU_ASSERT_TRUE(losses);
    CU_ASSERT_TRUE(same_bits(&c.res.first_loss, &s.res.first_loss, sizeof(double)));
    CU_ASSERT_TRUE(same_bits(&c.res.last_loss, &s.res.last_loss, sizeof(double)));
    CU_ASSERT_TRUE(same_bits(&c.res.eval_loss, &s.res.eval_loss, sizeof(double)));
    CU_ASSERT_TRUE(same_bits(&c.res.eval_accuracy, &s.res.eval_accuracy, sizeof(double)));
    CU_ASSERT_TRUE(same_bits(&c.res.grad_norm, &s.res.grad_norm, sizeof(double)));
    /* the same collectives, calls and bytes, op by op and unit by unit */
    CU_ASSERT_TRUE(c.table[0] != '\0' && strcmp(c.table, s.table) == 0);
    double diff = 0;
    bool bitwise = false;
    CU_ASSERT_TRUE(c.res.saved[0] && s.res.saved[0]);
    CU_ASSERT_TRUE(ckpt_test_compare(c.res.saved, s.res.saved, &diff, &bitwise));
    CU_ASSERT_TRUE(bitwise);
    /* the device is shown where the run is on one, and nothing changes on the cpu */
    char line[96];
    snprintf(line, sizeof line, ", device sim:0 (rank r on sim:(r mod %d))\n", g_sim_devices);
    CU_ASSERT_PTR_NOT_NULL(strstr(s.text, line));
    /* the backend that ran: the parallel line's "(nccl)" or "(local)" */
    CU_ASSERT_PTR_NOT_NULL(strstr(s.text, g_nccl ? " ranks (nccl): " : " ranks (local): "));
    CU_ASSERT_PTR_NOT_NULL(strstr(c.text, " ranks (local): "));
    CU_ASSERT_PTR_NOT_NULL(strstr(s.text, "  on sim:0\n"));
    CU_ASSERT_PTR_NOT_NULL(s.metrics && strstr(s.metrics, "\"device\": \"sim:0\""));
    CU_ASSERT_PTR_NULL(strstr(c.text, "device"));
    CU_ASSERT_PTR_NULL(c.metrics ? strstr(c.metrics, "device") : "no metrics");
    printf("\n    %s: %lld steps, loss %.6f -> %.6f, sim%s %s the cpu (checkpoint max diff %.1e)",
           name, (long long)s.res.steps, s.res.first_loss, s.res.last_loss,
           g_nccl ? " on nccl" : "", losses && bitwise ? "bitwise" : "DIFFERS from", diff);
    if (!losses || !bitwise || strcmp(c.table, s.table) != 0)
        printf("\n    cpu:\n%s\n    sim:\n%s", c.text, s.text);
    free(c.text), free(s.text), free(c.metrics), free(s.metrics);
}

/* (dp, tp) = (2, 2): TP over the Linear pairs, then FSDP per hidden Linear over dp. */
static void test_mlp_fsdp_tp(void) {
    cpu_against_sim("mlp_2x2", g_mlp,
                    SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer"));
}

/* (2, 1) FULL_SHARD, classification with a held-out split (predictions read back to count the
 * right ones) and two micro-batches (the gradient of each scaled on the way). */
static void test_mlp_full_shard(void) {
    cpu_against_sim("mlp_2x1", g_mlp,
                    SET("parallel.ranks=2", "parallel.strategy=full_shard",
                        "data.task=classification", "data.eval_fraction=0.25",
                        "train.grad_accum=2"));
}

/* (2, 2): the Llama's TP plan with loss parallel, then FSDP per decoder layer over dp. */
static void test_llama_fsdp_tp(void) {
    cpu_against_sim("llama_2x2", g_llama,
                    SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer"));
}

/* (2, 1) FULL_SHARD over the whole Llama. */
static void test_llama_full_shard(void) {
    cpu_against_sim("llama_2x1", g_llama, SET("parallel.ranks=2", "parallel.strategy=full_shard"));
}

/* A checkpoint of a cpu run resumed on sim, and one of a sim run resumed on cpu, end where an
 * uninterrupted cpu run does, bit for bit (losses of the resumed steps and the checkpoint). */
static void resume_across(const char *first, const char *second) {
    char name[64], dir[1300];
    snprintf(name, sizeof name, "resume_%s_then_%s", first, second);
    const char *const *layout = SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer");
    run_out a = {0}, b = {0}, whole = {0};
    FSDP_TEST_OK(
        run(name, g_mlp,
            SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer", "train.steps=3"), first,
            &a));
    snprintf(dir, sizeof dir, "checkpoint.dir=%s", a.dir); /* resume = auto: from step 3 */
    FSDP_TEST_OK(run(name, g_mlp,
                     SET("parallel.ranks=4", "parallel.tp=2", "parallel.wrap=layer", dir), second,
                     &b));
    snprintf(name, sizeof name, "whole_for_%s_then_%s", first, second);
    FSDP_TEST_OK(run(name, g_mlp, layout, "cpu", &whole));
    CU_ASSERT_EQUAL(b.res.start_step, 3);
    CU_ASSERT_EQUAL(b.res.n_step_losses, 3);
    CU_ASSERT_EQUAL(whole.res.n_step_losses, 6);
    bool losses = b.res.n_step_losses == 3 && whole.res.n_step_losses == 6 &&
                  same_bits(b.res.step_loss, whole.res.step_loss + 3, 3 * sizeof(double));
    CU_ASSERT_TRUE(losses);
    double diff = 0;
    bool bitwise = false;
    CU_ASSERT_TRUE(ckpt_test_compare(b.res.saved, whole.res.saved, &diff, &bitwise));
    CU_ASSERT_TRUE(bitwise);
    printf("\n    3 steps on %s, 3 more on %s: %s 6 on cpu (checkpoint max diff %.1e)", first,
           second, losses && bitwise ? "bitwise" : "DIFFER from", diff);
    free(a.text), free(b.text), free(whole.text), free(a.metrics), free(b.metrics),
        free(whole.metrics);
}

static void test_resume_other_device(void) {
    resume_across("cpu", "sim");
    resume_across("sim", "cpu");
}

/* An unknown device when the key is read; cuda on a machine without a GPU and any device under
 * the mpi backend when the configuration is checked; each message names the key and the fix. */
static void test_refusals(void) {
    char err[TRAIN_ERROR_SIZE] = "";
    train_config_init(&g_cfg);
    CU_ASSERT_EQUAL(train_config_set(&g_cfg, "parallel.device=gpu", err, sizeof err),
                    FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "device"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "sim"));
    if (fsdp_device_count(FSDP_DEVICE_CUDA) == 0) {
        configure(g_mlp, SET("parallel.ranks=2"), "cuda", NULL, NULL);
        err[0] = '\0';
        CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
        printf("\n    %s", err);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "[parallel] device = cuda"));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "no GPU is usable"));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "device = sim"));
        train_result res;
        CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                        FSDP_ERR_CONFIG);
        CU_ASSERT_EQUAL(res.rank, -1); /* refused before any rank ran */
    } else {
        printf("\n    (a GPU is usable here: cuda is not refused)");
    }
    if (fsdp_backend_available(FSDP_BACKEND_MPI)) {
        configure(g_mlp, SET("parallel.backend=mpi"), "sim", NULL, NULL);
        err[0] = '\0';
        CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
        printf("\n    %s", err);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "[parallel] device = sim"));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "backend = local"));
    } else {
        printf("\n    (no MPI backend in this build: the mpi refusal is not reached)");
    }
}

/* Expects train_config_check to refuse g_cfg with a message holding each of the strings. */
static void expect_refused(const char *const *parts) {
    char err[TRAIN_ERROR_SIZE] = "";
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_ERR_CONFIG);
    printf("\n    %s", err);
    for (int i = 0; parts[i]; i++) {
        bool has = strstr(err, parts[i]) != NULL;
        CU_ASSERT_TRUE(has);
        if (!has) printf("\n    (missing: %s)", parts[i]);
    }
}

/* backend = nccl: no nccl backend in the build; the cpu device; more rank threads than
 * devices; under mpirun (the launcher's variable set) it is nccl-mpi, refused when that is not
 * built. Each message names the key and the fix. */
static void test_nccl_refusals(void) {
    if (!fsdp_backend_available(FSDP_BACKEND_NCCL)) {
        configure(g_mlp, SET("parallel.ranks=2", "parallel.backend=nccl"), "sim", NULL, NULL);
        expect_refused(SET("[parallel] backend = nccl", "no nccl backend", "backend = local"));
        return;
    }
    configure(g_mlp, SET("parallel.ranks=2", "parallel.backend=nccl"), "cpu", NULL, NULL);
    expect_refused(SET("[parallel] backend = nccl", "[parallel] device = cpu", "device = cuda",
                       "FSDP_NCCL_LIBRARY", "backend = local"));
    train_result res;
    char err[TRAIN_ERROR_SIZE] = "";
    CU_ASSERT_EQUAL(train_run(fsdp_test_ctx(), &g_cfg, NULL, &res, err, sizeof err),
                    FSDP_ERR_CONFIG);
    CU_ASSERT_EQUAL(res.rank, -1); /* refused before any world was made */
    configure(g_mlp, SET("parallel.ranks=4", "parallel.tp=2", "parallel.backend=nccl"), "sim", NULL,
              NULL); /* 4 rank threads, FSDP_SIM_DEVICES = 2 */
    expect_refused(SET("[parallel] backend = nccl", "the world has 4 ranks", "has 2 devices",
                       "FSDP_SIM_DEVICES"));
    configure(g_mlp, SET("parallel.ranks=2", "parallel.backend=nccl"), "sim", NULL, NULL);
    expect_refused(SET("[parallel] device = sim", "[parallel] backend = nccl", "FSDP_NCCL_LIBRARY",
                       "stand-in NCCL"));
    setenv("FSDP_NCCL_LIBRARY", "libfsdp_nccl_standin.so", 1); /* checked, not opened */
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);                    /* as mpirun starts the process */
    configure(g_mlp, SET("parallel.backend=nccl"), "sim", NULL, NULL);
    CU_ASSERT_EQUAL(train_config_backend(&g_cfg), TRAIN_BACKEND_NCCL_MPI);
    CU_ASSERT_EQUAL(train_config_world_size(&g_cfg), 0); /* the job's size decides */
    if (!fsdp_backend_available(FSDP_BACKEND_NCCL_MPI)) {
        expect_refused(SET("[parallel] backend = nccl", "no nccl-mpi backend", "without mpirun"));
    } else {
        err[0] = '\0';
        CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_OK);
        configure(g_mlp, SET("parallel.backend=nccl"), "cpu", NULL, NULL);
        expect_refused(SET("[parallel] backend = nccl", "[parallel] device = cpu"));
    }
    unsetenv("OMPI_COMM_WORLD_SIZE");
    configure(g_mlp, SET("parallel.ranks=2", "parallel.backend=nccl"), "sim", NULL, NULL);
    CU_ASSERT_EQUAL(train_config_backend(&g_cfg), TRAIN_BACKEND_NCCL);
    err[0] = '\0';
    CU_ASSERT_EQUAL(train_config_check(&g_cfg, err, sizeof err), FSDP_OK); /* 2 ranks, 2 devices */
    unsetenv("FSDP_NCCL_LIBRARY");
}

#ifndef FSDP_TRAIN_EXE
#define FSDP_TRAIN_EXE ""
#endif

/* `mpirun -np 2 fsdp-train` (FSDP_TRAIN_MPIRUN, set by CTest's test_train_device_mpi2) with
 * backend = nccl, which resolves to nccl-mpi there: each process refuses the cpu device, and
 * sim without FSDP_NCCL_LIBRARY, before making a world (exit status 2, the key and the fix
 * named once per process); in a build without nccl-mpi, the backend itself. */
static void test_nccl_under_mpirun(void) {
    const char *mpirun = getenv("FSDP_TRAIN_MPIRUN");
    if (!mpirun || !*mpirun || !*FSDP_TRAIN_EXE) {
        fsdp_test_skip("FSDP_TRAIN_MPIRUN is not set (CTest's test_train_device_mpi2 sets it)");
        return;
    }
    bool built = fsdp_backend_available(FSDP_BACKEND_NCCL_MPI);
    static const char *const devices[] = {"cpu", "sim"};
    for (int i = 0; i < 2; i++) {
        char cmd[4096], *out = NULL;
        snprintf(cmd, sizeof cmd,
                 "env -u FSDP_NCCL_LIBRARY %s '%s' --config '%s/examples/mlp.ini' --set "
                 "parallel.backend=nccl --set parallel.device=%s 2>&1",
                 mpirun, FSDP_TRAIN_EXE, FSDP_SOURCE_DIR, devices[i]);
        int status = fsdp_test_shell(cmd, &out);
        printf("\n    %s: exit %d\n%s", cmd, status, out);
        CU_ASSERT_EQUAL(status, 2);
        const char *want = !fsdp_backend_available(FSDP_BACKEND_NCCL) ? "no nccl backend"
                           : !built                                   ? "no nccl-mpi backend"
                           : i == 0                                   ? "[parallel] device = cpu"
                                                                      : "needs the stand-in NCCL";
        /* once per process: both refused before any world was made */
        const char *first = strstr(out, want);
        CU_ASSERT_PTR_NOT_NULL(first);
        CU_ASSERT_PTR_NOT_NULL(first ? strstr(first + 1, want) : NULL);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "[parallel] backend = nccl"));
        free(out);
    }
}

/* The stand-in that FSDP_NCCL_LIBRARY named is the library the runs loaded, and every
 * communicator it made was destroyed with its world. */
static void check_standin_used(void) {
    const char *path = getenv("FSDP_NCCL_LIBRARY");
    void *h = path ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    CU_ASSERT_PTR_NOT_NULL(h);
    int (*live)(void) = NULL;
    void *f = h ? dlsym(h, "fsdpStandinLiveComms") : NULL;
    if (f) memcpy(&live, &f, sizeof f);
    CU_ASSERT_PTR_NOT_NULL(live);
    if (live) CU_ASSERT_EQUAL(live(), 0);
    if (h) dlclose(h);
}

/* (2, 2) on nccl: the MLP (FSDP per hidden Linear after TP) and the Llama (its TP plan, FSDP per
 * decoder layer), each against the local backend's cpu run. */
static void test_nccl_mlp_fsdp_tp(void) {
    test_mlp_fsdp_tp();
    check_standin_used();
}

static void test_nccl_llama_fsdp_tp(void) {
    test_llama_fsdp_tp();
    check_standin_used();
}

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A token file of 3000 byte ids (words of a small vocabulary drawn by an LCG), vocab 256. */
static int write_tokens(const char *path) {
    static const char *const words[] = {"the ", "cat ", "sat ", "on ", "a ",   "mat ",
                                        "and ", "dog ", "ran ", "to ", "her ", "house "};
    enum { N = 3000 };
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    unsigned char hd[TRAIN_TOKENS_HEADER];
    memcpy(hd, TRAIN_TOKENS_MAGIC, 8);
    put_le(hd + 8, 1, 4);
    put_le(hd + 12, 2, 4);
    put_le(hd + 16, N, 8);
    put_le(hd + 24, 256, 8);
    fwrite(hd, 1, sizeof hd, f);
    uint32_t x = 12345;
    for (int n = 0; n < N;) {
        x = x * 1103515245u + 12345u;
        for (const char *w = words[(x >> 16) % 12]; *w && n < N; w++, n++) {
            unsigned char b[2];
            put_le(b, (unsigned char)*w, 2);
            fwrite(b, 1, 2, f);
        }
    }
    return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"mlp_fsdp_tp", test_mlp_fsdp_tp},
        {"mlp_full_shard", test_mlp_full_shard},
        {"llama_fsdp_tp", test_llama_fsdp_tp},
        {"llama_full_shard", test_llama_full_shard},
        {"resume_other_device", test_resume_other_device},
        {"refusals", test_refusals},
        {"nccl_refusals", test_nccl_refusals},
        {"nccl_under_mpirun", test_nccl_under_mpirun},
    };
    static const fsdp_test_case nccl_cases[] = {
        {"nccl_mlp_fsdp_tp", test_nccl_mlp_fsdp_tp},
        {"nccl_llama_fsdp_tp", test_nccl_llama_fsdp_tp},
    };
    const char *be = getenv("FSDP_TEST_BACKEND");
    g_nccl = be && strcmp(be, "nccl") == 0;
#ifdef FSDP_TEST_NCCL_STANDIN
    /* the library a user would name: no call to a test-only API selects it */
    if (g_nccl) setenv("FSDP_NCCL_LIBRARY", FSDP_TEST_NCCL_STANDIN, 1);
    if (!g_nccl) unsetenv("FSDP_NCCL_LIBRARY"); /* its refusals expect none */
#else
    if (g_nccl) {
        printf("test_train_device: no nccl backend and stand-in NCCL in this build: skipped\n");
        return FSDP_TEST_SKIPPED;
    }
#endif
    g_sim_devices = g_nccl ? 4 : 2; /* nccl: one per rank; else shared by the rank threads */
    setenv("FSDP_SIM_DEVICES", g_nccl ? "4" : "2", 1); /* before the first use reads them */
    setenv("FSDP_SIM_MEMORY", "256M", 1);
    unsetenv("FSDP_SIM_MODE"); /* deferred */
    g_root = ckpt_test_tmp_root();
    if (!g_root) return 2;
    snprintf(g_tokens, sizeof g_tokens, "%s/tokens.tok", g_root);
    if (write_tokens(g_tokens) != 0) return 2;
    int rc = g_nccl ? fsdp_test_run(argc, argv, "train_device_nccl", nccl_cases,
                                    (int)(sizeof nccl_cases / sizeof nccl_cases[0]))
                    : fsdp_test_run(argc, argv, "train_device", cases,
                                    (int)(sizeof cases / sizeof cases[0]));
    ckpt_test_remove_tree(g_root);
    free(g_root);
    return rc;
}
