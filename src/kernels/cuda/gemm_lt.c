/* gemm_lt.c: the table's GEMMs through cuBLASLt (cublasLtMatmul), chosen per thread
 * (fsdp_cuda_thread_set_gemm, FSDP_CUDA_GEMM=lt). The column-major swap of gemm.c (the
 * row-major C is the column-major C^T = op(B)^T op(A)^T: B goes first); f32 compute, TF32
 * where the f32 entry allows it. The algorithm comes from cublasLtMatmulAlgoGetHeuristic once
 * per key, cached in a fixed table per device that all threads share under its mutex (a
 * lookup copies the algorithm out; the query runs outside the lock with the caller's handle,
 * and two threads missing the same key both query and the second insert finds the first).
 * Handles and workspaces are per thread and device (rank threads sharing a GPU never share
 * either); a workspace comes once from the caching allocator and is handed back when the
 * thread exits. An epilogue (bias, activation, bias gradient: epilogue.c) is part of the key. */
#include <cublasLt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

/* ---- the choice ---- */

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static fsdp_cuda_gemm_lib env_lib;

/* FSDP_CUDA_GEMM, read once: lt (the default) or cublas; anything else aborts. */
static void read_env(void) {
    const char *s = getenv("FSDP_CUDA_GEMM");
    if (!s || !*s || strcmp(s, "lt") == 0) {
        env_lib = FSDP_CUDA_GEMM_LT;
    } else if (strcmp(s, "cublas") == 0) {
        env_lib = FSDP_CUDA_GEMM_CUBLAS;
    } else {
        fprintf(stderr,
                "libfsdp: FSDP_CUDA_GEMM=%s is not a GEMM library: set it to lt or cublas, or "
                "unset it (lt)\n",
                s);
        abort();
    }
}

static _Thread_local fsdp_cuda_gemm_lib thread_lib = FSDP_CUDA_GEMM_DEFAULT;

void fsdp_cuda_thread_set_gemm(fsdp_cuda_gemm_lib lib) {
    thread_lib = lib;
}

fsdp_cuda_gemm_lib fsdp_cuda_thread_gemm(void) {
    if (thread_lib != FSDP_CUDA_GEMM_DEFAULT) return thread_lib;
    pthread_once(&env_once, read_env);
    return env_lib;
}

/* ---- this thread's handle and workspace per device ---- */

typedef struct lt_device {
    cublasLtHandle_t handle; // NULL until first use
    void *workspace;         // FSDP_CUDA_LT_WORKSPACE bytes from the caching allocator
    cudaStream_t on;         // the stream the workspace last served
    /* Recorded after every GEMM on a stream other than the thread's default one (such a
     * stream may be destroyed before the next GEMM), and on the default stream when the
     * workspace leaves it: the next stream waits for it before it writes the workspace. */
    cudaEvent_t done;
} lt_device;

typedef struct lt_thread {
    lt_device dev[FSDP_CUDA_MAX_DEVICES];
} lt_thread;

static void lt_thread_release(void *state);

/* Makes `stream` wait for the workspace's last user when that was another stream. */
static void workspace_follow(lt_device *d, cudaStream_t stream) {
    if (d->on == stream) return;
    if (!d->done) FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&d->done, cudaEventDisableTiming));
    if (d->on == cudaStreamPerThread) FSDP_CUDA_CHECK(cudaEventRecord(d->done, d->on));
    FSDP_CUDA_CHECK(cudaStreamWaitEvent(stream, d->done, 0));
    d->on = stream;
}

/* This thread's state on `device` (current), ready for a GEMM on `stream`. */
static lt_device *lt_here(int device, cudaStream_t stream) {
    void **slot = fsdp_cuda_thread_lt(lt_thread_release);
    if (!*slot) {
        *slot = calloc(1, sizeof(lt_thread));
        FSDP_ASSERT(*slot);
    }
    lt_device *d = &((lt_thread *)*slot)->dev[device];
    if (!d->handle) FSDP_CUDA_CHECK_LT(cublasLtCreate(&d->handle));
    if (!d->workspace) {
        if (fsdp_cuda_block_alloc(NULL, device, FSDP_CUDA_LT_WORKSPACE, &d->workspace) != FSDP_OK) {
            fprintf(stderr,
                    "libfsdp: cannot allocate the cuBLASLt workspace (%zu bytes) on cuda:%d: "
                    "free device memory, or run the GEMMs through cuBLAS (FSDP_CUDA_GEMM=cublas)\n",
                    FSDP_CUDA_LT_WORKSPACE, device);
            abort();
        }
        d->on = stream; // the allocator ordered the block after its previous user
    }
    workspace_follow(d, stream);
    return d;
}

/* The thread's state, when it exits (thread.c calls it). */
static void lt_thread_release(void *state) {
    lt_thread *lt = state;
    int keep = 0;
    if (cudaGetDevice(&keep) != cudaSuccess) keep = -1;
    for (int dev = 0; dev < FSDP_CUDA_MAX_DEVICES; dev++) {
        lt_device *d = &lt->dev[dev];
        if (!d->handle && !d->workspace) continue;
        cudaSetDevice(dev);
        if (d->workspace) {
            workspace_follow(d, fsdp_cuda_stream_of(dev)); // block_free records on that stream
            fsdp_cuda_block_free(dev, d->workspace);
        }
        if (d->done) cudaEventDestroy(d->done);
        if (d->handle) cublasLtDestroy(d->handle);
    }
    if (keep >= 0) cudaSetDevice(keep);
    (void)cudaGetLastError();
    free(lt);
}

/* ---- the heuristics' cache ---- */

typedef struct lt_key {
    int64_t M, N, K, lda, ldb, ldc;
    int ab_type, compute;
    bool trans_a, trans_b;
    unsigned align_a, align_b, align_c; // bytes, a power of two up to 256
    int epilogue;                       // 0: none; else the cublasLtEpilogue_t
    int64_t aux_ld;
    unsigned align_bias, align_aux; // the heuristic reads the vectors' alignment from them
} lt_key;

typedef struct lt_slot {
    lt_key key;
    uint64_t used_at; // the cache's clock at its last use
    bool has_algo;    // false: the heuristic found none; cublasGemmEx runs the key
    cublasLtMatmulAlgo_t algo;
} lt_slot;

typedef struct lt_cache {
    pthread_mutex_t mu;
    uint64_t clock;
    lt_slot slot[FSDP_CUDA_LT_CACHE_SLOTS];
    fsdp_cuda_gemm_lt_stats stats; // stats.slots_used slots are filled, from the first
} lt_cache;

static lt_cache caches[FSDP_CUDA_MAX_DEVICES];
static pthread_once_t caches_once = PTHREAD_ONCE_INIT;

static void caches_init(void) {
    for (int d = 0; d < FSDP_CUDA_MAX_DEVICES; d++) pthread_mutex_init(&caches[d].mu, NULL);
}

static lt_cache *cache_of(int device) {
    FSDP_ASSERT(device >= 0 && device < FSDP_CUDA_MAX_DEVICES);
    pthread_once(&caches_once, caches_init);
    return &caches[device];
}

static bool key_equal(const lt_key *a, const lt_key *b) {
    return a->M == b->M && a->N == b->N && a->K == b->K && a->lda == b->lda && a->ldb == b->ldb &&
           a->ldc == b->ldc && a->ab_type == b->ab_type && a->compute == b->compute &&
           a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->align_a == b->align_a &&
           a->align_b == b->align_b && a->align_c == b->align_c && a->epilogue == b->epilogue &&
           a->aux_ld == b->aux_ld && a->align_bias == b->align_bias && a->align_aux == b->align_aux;
}

/* The largest power of two up to 256 that divides the address: cuBLASLt's algorithms need
 * their operands aligned (its heuristic assumes 256 bytes unless told), and views into flat
 * parameters are often less. */
static unsigned alignment(const void *p) {
    uintptr_t a = (uintptr_t)p | 256u;
    return (unsigned)(a & -a);
}

/* Finds key; on a hit copies its slot to *out. */
static bool cache_find(lt_cache *c, const lt_key *key, lt_slot *out) {
    pthread_mutex_lock(&c->mu);
    bool found = false;
    for (int i = 0; i < c->stats.slots_used && !found; i++)
        if (key_equal(&c->slot[i].key, key)) {
            c->slot[i].used_at = ++c->clock;
            c->stats.hits++;
            *out = c->slot[i];
            found = true;
        }
    pthread_mutex_unlock(&c->mu);
    return found;
}

/* Stores a queried slot: in a free slot, else over the least recently used one (none when
 * another thread stored the same key meanwhile). */
static void cache_store(lt_cache *c, const lt_slot *s) {
    pthread_mutex_lock(&c->mu);
    c->stats.queries++;
    int at = -1;
    for (int i = 0; i < c->stats.slots_used && at < 0; i++)
        if (key_equal(&c->slot[i].key, &s->key)) at = i;
    if (at < 0 && c->stats.slots_used < FSDP_CUDA_LT_CACHE_SLOTS) {
        at = c->stats.slots_used++;
    } else if (at < 0) {
        at = 0;
        for (int i = 1; i < FSDP_CUDA_LT_CACHE_SLOTS; i++)
            if (c->slot[i].used_at < c->slot[at].used_at) at = i;
        c->stats.evictions++;
    }
    c->slot[at] = *s;
    c->slot[at].used_at = ++c->clock;
    pthread_mutex_unlock(&c->mu);
}

fsdp_cuda_gemm_lt_stats fsdp_cuda_gemm_lt_stats_get(int device) {
    fsdp_cuda_gemm_lt_stats s = {0};
    if (device < 0 || device >= FSDP_CUDA_MAX_DEVICES) return s;
    lt_cache *c = cache_of(device);
    pthread_mutex_lock(&c->mu);
    s = c->stats;
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* ---- the GEMM ---- */

/* The operation and the layouts of B, A and C (cuBLASLt's A, B and C = D), column-major. */
typedef struct lt_desc {
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t b, a, c;
} lt_desc;

/* The epilogue's attributes: its kind, its f32 bias (or bias gradient) vector, and the GELU
 * input it saves (column-major, the row-major (M, N) C's transpose: leading dimension aux_ld). */
static void epilogue_init(lt_desc *d, const fsdp_cuda_gemm_args *g) {
    uint32_t epilogue = (uint32_t)g->epilogue;
    FSDP_CUDA_CHECK_LT(cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                      &epilogue, sizeof epilogue));
    if (g->bias) {
        int32_t type = CUDA_R_32F;
        FSDP_CUDA_CHECK_LT(cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                          &g->bias, sizeof g->bias));
        FSDP_CUDA_CHECK_LT(cublasLtMatmulDescSetAttribute(
            &d->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type));
    }
    if (g->aux) {
        FSDP_CUDA_CHECK_LT(cublasLtMatmulDescSetAttribute(
            &d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux, sizeof g->aux));
        FSDP_CUDA_CHECK_LT(cublasLtMatmulDescSetAttribute(
            &d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g->aux_ld, sizeof g->aux_ld));
    }
}

static void desc_init(lt_desc *d, const fsdp_cuda_gemm_args *g) {
    FSDP_CUDA_CHECK_LT(cublasLtMatmulDescInit(&d->op, g->compute, CUDA_R_32F));
    int32_t op_b = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    int32_t op_a = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    FSDP_CUDA_CHECK_LT(
        cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
    FSDP_CUDA_CHECK_LT(
        cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
    // row-major B (K, N) is column-major (N, K); B^T's storage (N, K) is column-major (K, N)
    FSDP_CUDA_CHECK_LT(cublasLtMatrixLayoutInit(&d->b, g->ab_type, g->trans_b ? g->K : g->N,
                                                g->trans_b ? g->N : g->K, g->ldb));
    FSDP_CUDA_CHECK_LT(cublasLtMatrixLayoutInit(&d->a, g->ab_type, g->trans_a ? g->M : g->K,
                                                g->trans_a ? g->K : g->M, g->lda));
    FSDP_CUDA_CHECK_LT(cublasLtMatrixLayoutInit(&d->c, CUDA_R_32F, g->N, g->M, g->ldc));
    if (g->epilogue) epilogue_init(d, g);
}

/* Asks cuBLASLt for the best algorithm of the key within the workspace and alignments. */
static void query(lt_slot *s, cublasLtHandle_t handle, lt_desc *d) {
    cublasLtMatmulPreferenceOpaque_t pref;
    FSDP_CUDA_CHECK_LT(cublasLtMatmulPreferenceInit(&pref));
    uint64_t ws = FSDP_CUDA_LT_WORKSPACE;
    FSDP_CUDA_CHECK_LT(cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        uint32_t bytes;
    } aligns[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, s->key.align_b},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, s->key.align_a},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, s->key.align_c},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, s->key.align_c}};
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++)
        FSDP_CUDA_CHECK_LT(cublasLtMatmulPreferenceSetAttribute(
            &pref, aligns[i].attr, &aligns[i].bytes, sizeof(uint32_t)));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, &d->op, &d->b, &d->a, &d->c, &d->c,
                                                       &pref, 1, &result, &found);
    s->has_algo = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (!s->has_algo && st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_SUCCESS)
        FSDP_CUDA_CHECK_LT(st); // aborts naming the status
    if (s->has_algo) s->algo = result.algo;
}

bool fsdp_cuda_gemm_lt(const fsdp_cuda_gemm_args *g) {
    int device = 0;
    FSDP_CUDA_CHECK(cudaGetDevice(&device));
    cudaStream_t stream = fsdp_cuda_stream();
    lt_device *d = lt_here(device, stream);
    lt_cache *c = cache_of(device);
    lt_slot s = {.key = {.M = g->M,
                         .N = g->N,
                         .K = g->K,
                         .lda = g->lda,
                         .ldb = g->ldb,
                         .ldc = g->ldc,
                         .ab_type = g->ab_type,
                         .compute = g->compute,
                         .trans_a = g->trans_a,
                         .trans_b = g->trans_b,
                         .align_a = alignment(g->A),
                         .align_b = alignment(g->B),
                         .align_c = alignment(g->C),
                         .epilogue = g->epilogue,
                         .aux_ld = g->aux_ld,
                         .align_bias = g->bias ? alignment(g->bias) : 0,
                         .align_aux = g->aux ? alignment(g->aux) : 0}};
    lt_desc desc;
    desc_init(&desc, g);
    if (!cache_find(c, &s.key, &s)) {
        query(&s, d->handle, &desc);
        cache_store(c, &s);
    }
    if (!s.has_algo) {
        pthread_mutex_lock(&c->mu);
        c->stats.fallbacks++;
        pthread_mutex_unlock(&c->mu);
        return false; /* the caller runs it through cuBLAS */
    }
    FSDP_CUDA_CHECK_LT(cublasLtMatmul(d->handle, &desc.op, &g->alpha, g->B, &desc.b, g->A, &desc.a,
                                      &g->beta, g->C, &desc.c, g->C, &desc.c, &s.algo, d->workspace,
                                      FSDP_CUDA_LT_WORKSPACE, stream));
    fsdp_cuda_count_launch(-1);
    if (stream != cudaStreamPerThread) {
        if (!d->done) FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&d->done, cudaEventDisableTiming));
        FSDP_CUDA_CHECK(cudaEventRecord(d->done, stream));
    }
    return true;
}
