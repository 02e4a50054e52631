/* bench_ckpt.c: checkpoint save and load of a 100 M-parameter MLP with Adam on 4 rank threads
 * (dp 2 x tp 2, FULL_SHARD), against this machine's disk measured in the same run: 4 threads
 * writing and reading back the same number of raw bytes with write/fsync and read. Prints the
 * stored/raw ratio, save and load MB/s (load at the saving layout and at dp 4), the time an
 * async save blocks the caller against a sync save, and the growth of the process's peak RSS
 * during a sync save per rank. Usage: bench_ckpt [DIR] (default: a new directory under $TMPDIR,
 * or /tmp). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h> // defines: nanosleep
#include <unistd.h>

#include "bench_cli.h" // defines: bench_cli_help, bench_cli_fail
#include "bench_util.h"
#include "core/error.h" // defines: FSDP_TRY
#include "fsdp/fsdp.h"

#define RANKS 4
static const int64_t widths[] = {2048, 8192, 8192, 2048}; /* 100.7 M parameters */

typedef struct bench {
    const char *dir;
    int dp, tp;
    bool save, async, load;
    char load_path[1200];
    double seconds, blocking;
    int64_t raw_bytes;
    long rss_before_kb, rss_after_kb;
} bench;

/* Resident set size now, in kB (from /proc/self/statm). */
static long rss_kb(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    if (f) fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Samples the RSS every millisecond until stopped; keeps the largest. */
typedef struct sampler {
    volatile bool stop;
    long peak_kb;
    pthread_t thread;
} sampler;

static void *sample(void *arg) {
    sampler *s = arg;
    while (!s->stop) {
        long r = rss_kb();
        if (r > s->peak_kb) s->peak_kb = r;
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    return NULL;
}

/* One Adam step on a small random batch, so the optimizer state is not all zeros. */
static fsdp_status one_step(fsdp_ctx *ctx, const bench *b, fsdp_mesh *mesh, fsdp_module *m,
                            fsdp_optimizer *opt) {
    (void)b;
    (void)mesh;
    fsdp_tensor *x = NULL, *y = NULL, *dout = NULL;
    fsdp_init u = {.kind = FSDP_INIT_UNIFORM, .a = -1.0f, .b = 1.0f};
    const fsdp_tensor *out;
    float loss;
    fsdp_status s = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){8, 2048}, &x);
    if (s == FSDP_OK)
        s = fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, (int64_t[]){8, 2048}, &y);
    if (s == FSDP_OK) s = fsdp_init_tensor(ctx, x, &u, 1, 1);
    if (s == FSDP_OK) s = fsdp_init_tensor(ctx, y, &u, 1, 2);
    if (s == FSDP_OK) s = fsdp_module_forward(ctx, m, x, &out);
    if (s == FSDP_OK) s = fsdp_tensor_create_like(ctx, out, &dout);
    if (s == FSDP_OK) s = fsdp_loss_mse(ctx, out, y, &loss, dout);
    if (s == FSDP_OK) s = fsdp_module_backward(ctx, m, dout, NULL);
    if (s == FSDP_OK) s = fsdp_optimizer_step(ctx, opt);
    fsdp_tensor_free(x);
    fsdp_tensor_free(y);
    fsdp_tensor_free(dout);
    return s;
}

static fsdp_status setup(fsdp_ctx *ctx, const bench *b, fsdp_mesh **mesh, fsdp_module **m,
                         fsdp_sharded **sh, fsdp_optimizer **opt, fsdp_state **st) {
    FSDP_TRY(fsdp_mesh_create(ctx, 2, (int[]){b->dp, b->tp}, (const char *[]){"dp", "tp"}, mesh));
    FSDP_TRY(fsdp_model_mlp(ctx, 4, widths, FSDP_ACT_RELU, m));
    if (b->tp > 1) {
        fsdp_mesh *tp;
        FSDP_TRY(fsdp_mesh_dim(ctx, *mesh, "tp", &tp));
        fsdp_tp_plan_entry plan[] = {{"0", FSDP_COLWISE()}, {"2", FSDP_ROWWISE()}};
        FSDP_TRY(fsdp_tp_parallelize(ctx, *m, tp, 2, plan, NULL));
    }
    fsdp_group *dp;
    FSDP_TRY(fsdp_mesh_get_group(ctx, *mesh, "dp", &dp));
    FSDP_TRY(fsdp_fully_shard(ctx, *m, &(fsdp_fully_shard_options){.group = dp}, sh));
    FSDP_TRY(fsdp_adam_create(ctx, fsdp_sharded_flat_params(*sh), &(fsdp_adam_options){.lr = 1e-3},
                              opt));
    FSDP_TRY(one_step(ctx, b, *mesh, *m, *opt));
    return fsdp_state_create(
        ctx, &(fsdp_state_sources){.model = *m, .sharded = *sh, .optimizer = *opt}, st);
}

static fsdp_status rank_fn(fsdp_ctx *ctx, int rank, void *user) {
    bench *b = user;
    fsdp_mesh *mesh = NULL;
    fsdp_module *m = NULL;
    fsdp_sharded *sh = NULL;
    fsdp_optimizer *opt = NULL;
    fsdp_state *st = NULL;
    fsdp_ckpt_writer *w = NULL;
    fsdp_status s = setup(ctx, b, &mesh, &m, &sh, &opt, &st);
    if (s == FSDP_OK && b->save)
        s = fsdp_ckpt_writer_create(ctx, b->dir, &(fsdp_ckpt_options){.async = b->async}, &w);
    if (s == FSDP_OK && rank == 0) {
        int64_t raw = 0;
        for (int i = 0; i < fsdp_state_num_entries(st); i++) {
            fsdp_state_entry e;
            fsdp_state_entry_get(ctx, st, i, &e);
            int64_t n = 1;
            for (int d = 0; d < e.ndim; d++) n *= e.shape[d];
            raw += n * 4;
        }
        b->raw_bytes = raw;
    }
    if (s == FSDP_OK) s = fsdp_barrier(ctx, fsdp_ctx_world_group(ctx));
    sampler smp = {0};
    if (rank == 0) {
        b->rss_before_kb = rss_kb();
        pthread_create(&smp.thread, NULL, sample, &smp);
    }
    double t0 = bench_now();
    if (s == FSDP_OK && b->save) s = fsdp_ckpt_save(ctx, w, st, &(fsdp_ckpt_meta){.step = 1});
    if (rank == 0 && w) b->blocking = fsdp_ckpt_writer_last_blocking_seconds(w);
    if (s == FSDP_OK && w) s = fsdp_ckpt_writer_wait(ctx, w);
    if (s == FSDP_OK && b->load) {
        fsdp_ckpt *ck = NULL;
        s = fsdp_ckpt_open(ctx, b->load_path, &ck);
        if (s == FSDP_OK) s = fsdp_ckpt_load(ctx, ck, st, NULL);
        fsdp_ckpt_close(ck);
    }
    if (s == FSDP_OK) s = fsdp_barrier(ctx, fsdp_ctx_world_group(ctx));
    if (rank == 0) {
        b->seconds = bench_now() - t0;
        smp.stop = true;
        pthread_join(smp.thread, NULL);
        b->rss_after_kb = smp.peak_kb;
    }
    fsdp_ckpt_writer_free(ctx, w);
    fsdp_state_free(st);
    fsdp_optimizer_free(opt);
    fsdp_sharded_free(sh);
    fsdp_module_free(m);
    fsdp_mesh_free(mesh);
    return s;
}

static double run(fsdp_world *world, bench *b) {
    fsdp_ctx *ctx;
    fsdp_ctx_create(NULL, &ctx);
    if (fsdp_world_run(ctx, world, rank_fn, b) != FSDP_OK) {
        fprintf(stderr, "bench_ckpt: %s\n", fsdp_last_error(ctx));
        exit(1);
    }
    fsdp_ctx_free(ctx);
    return b->seconds;
}

/* The disk baseline: RANKS threads each write (fsync) and read back bytes / RANKS. */
typedef struct disk {
    const char *dir;
    int index;
    int64_t bytes;
    bool read;
} disk;

static void *disk_io(void *arg) {
    disk *d = arg;
    char path[1200];
    snprintf(path, sizeof path, "%s/disk-%d.bin", d->dir, d->index);
    size_t block = 8 << 20;
    char *buf = malloc(block);
    for (size_t i = 0; i < block; i++) buf[i] = (char)(rand() & 0xff);
    int fd = open(path, d->read ? O_RDONLY : O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (int64_t done = 0; fd >= 0 && done < d->bytes; done += (int64_t)block) {
        ssize_t r = d->read ? read(fd, buf, block) : write(fd, buf, block);
        if (r <= 0) break;
    }
    if (fd >= 0 && !d->read) fsync(fd);
    if (fd >= 0) close(fd);
    if (d->read) unlink(path);
    free(buf);
    return NULL;
}

static double disk_seconds(const char *dir, int64_t bytes, bool read) {
    pthread_t t[RANKS];
    disk d[RANKS];
    double t0 = bench_now();
    for (int i = 0; i < RANKS; i++) {
        d[i] = (disk){.dir = dir, .index = i, .bytes = bytes / RANKS, .read = read};
        pthread_create(&t[i], NULL, disk_io, &d[i]);
    }
    for (int i = 0; i < RANKS; i++) pthread_join(t[i], NULL);
    return bench_now() - t0;
}

static int64_t dir_bytes(const char *path) {
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "du -sb '%s'", path);
    FILE *p = popen(cmd, "r");
    long long n = 0;
    if (p && fscanf(p, "%lld", &n) != 1) n = 0;
    if (p) pclose(p);
    return n;
}

/* Makes a new directory "$TMPDIR/fsdp-bench-ckpt-XXXXXX" (/tmp when TMPDIR is unset or empty)
 * into out (size bytes) and returns out; NULL, with a message, when it cannot. Its path goes to
 * the shell quoted with '...', so a TMPDIR holding a quote is refused. */
static const char *make_scratch_dir(char *out, size_t size) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    const char *why = NULL;
    int n = snprintf(out, size, "%s/fsdp-bench-ckpt-XXXXXX", base);
    if (strchr(base, '\''))
        why = "it holds a quote";
    else if (n < 0 || (size_t)n >= size)
        why = "the name is too long";
    else if (!mkdtemp(out))
        why = strerror(errno);
    if (!why) return out;
    fprintf(stderr, "bench_ckpt: cannot make a directory under '%s' (TMPDIR): %s\n", base, why);
    return NULL;
}

static const char usage[] =
    "usage: bench_ckpt [DIR]\n"
    "Checkpoint save and load of a 100 M-parameter MLP with Adam on 4 rank threads (dp 2 x tp 2,\n"
    "FULL_SHARD), against this machine's disk measured in the same run (4 threads writing with\n"
    "fsync and reading back the same raw bytes).\n"
    "arguments:\n"
    "  DIR         where it writes, about 3 GB at the peak: the checkpoints DIR/sync and\n"
    "              DIR/async, left in place, and the disk test's files, removed; default: a\n"
    "              new directory under $TMPDIR (/tmp when TMPDIR is unset or empty), removed\n"
    "              at the end. A DIR starting with '-' is refused (write ./-name).\n"
    "  --help, -h  prints this help\n"
    "prints: the stored/raw ratio, save and load MB/s against the disk's (load at the saving\n"
    "layout and at dp 4), the time an async save blocks the caller against a sync save, and the\n"
    "growth of the process's peak RSS during a sync save.\n"
    "exit status: 0 done; 1 a library call or the clean-up failed; 2 bad command line\n";

int main(int argc, char **argv) {
    bench_cli_help(argc, argv, usage);
    if (argc > 2) bench_cli_fail("bench_ckpt", usage, "unexpected argument '%s'", argv[2]);
    if (argc == 2 && argv[1][0] == '-')
        bench_cli_fail("bench_ckpt", usage, "unknown option '%s'", argv[1]);
    char scratch[1024];
    const char *dir = argc > 1 ? argv[1] : make_scratch_dir(scratch, sizeof scratch);
    fsdp_world *world;
    fsdp_ctx *ctx;
    fsdp_ctx_create(NULL, &ctx);
    if (!dir || fsdp_world_create(ctx, &(fsdp_world_options){.nranks = RANKS}, &world) != FSDP_OK)
        return 1;
    char sync_dir[1100], async_dir[1100];
    snprintf(sync_dir, sizeof sync_dir, "%s/sync", dir);
    snprintf(async_dir, sizeof async_dir, "%s/async", dir);
    bench sync = {.dir = sync_dir, .dp = 2, .tp = 2, .save = true};
    double t_sync = run(world, &sync);
    bench async = {.dir = async_dir, .dp = 2, .tp = 2, .save = true, .async = true};
    double t_async = run(world, &async);
    bench same = {.dp = 2, .tp = 2, .load = true}, other = {.dp = 4, .tp = 1, .load = true};
    snprintf(same.load_path, sizeof same.load_path, "%s/step-00000001", sync_dir);
    snprintf(other.load_path, sizeof other.load_path, "%s/step-00000001", sync_dir);
    double t_load = run(world, &same), t_load4 = run(world, &other);
    double raw = (double)sync.raw_bytes, mb = raw / 1e6;
    double t_dw = disk_seconds(dir, sync.raw_bytes, false),
           t_dr = disk_seconds(dir, sync.raw_bytes, true);
    int64_t stored = dir_bytes(same.load_path);
    printf(
        "checkpoint of a %.1f M-parameter MLP with Adam, 4 rank threads (dp 2 x tp 2 FULL_SHARD)\n",
        raw / 4 / 3 / 1e6);
    printf("raw %.1f MB, stored %.1f MB: stored/raw %.3f (zstd level 3)\n", mb,
           (double)stored / 1e6, (double)stored / raw);
    printf("%-34s %9s %9s %12s\n", "", "seconds", "MB/s", "vs disk");
    printf("%-34s %9.3f %9.1f %12s\n", "disk write (4 threads, fsync)", t_dw, mb / t_dw, "1.00");
    printf("%-34s %9.3f %9.1f %12.2f\n", "sync save", t_sync, mb / t_sync, t_dw / t_sync);
    printf("%-34s %9.3f %9.1f %12.2f\n", "async save, until committed", t_async, mb / t_async,
           t_dw / t_async);
    printf("%-34s %9.3f %9.1f %12s\n", "disk read (4 threads, warm cache)", t_dr, mb / t_dr,
           "1.00");
    printf("%-34s %9.3f %9.1f %12.2f\n", "load at dp 2 x tp 2", t_load, mb / t_load, t_dr / t_load);
    printf("%-34s %9.3f %9.1f %12.2f\n", "load at dp 4 x tp 1", t_load4, mb / t_load4,
           t_dr / t_load4);
    printf("async save blocked the caller %.3f s; sync save %.3f s (%.1f%%)\n", async.blocking,
           sync.blocking, 100.0 * async.blocking / sync.blocking);
    printf(
        "peak RSS growth during the sync save (sampled every ms): %.1f MB for 4 ranks (%.1f MB per "
        "rank; the state it saves is %.1f MB per rank)\n",
        (double)(sync.rss_after_kb - sync.rss_before_kb) / 1e3,
        (double)(sync.rss_after_kb - sync.rss_before_kb) / 4e3, mb / 4);
    fsdp_world_free(world);
    fsdp_ctx_free(ctx);
    if (argc <= 1) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) return 1;
    }
    return 0;
}
