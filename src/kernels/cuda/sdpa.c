/* sdpa.c: the attention path FSDP_CUDA_ATTENTION=cudnn: cuDNN's fused attention (sdpa_graph.c)
 * behind the CUDA table's f32 attention entries. cuDNN is opened at first use (dlopen of
 * libcudnn.so.9: FSDP_CUDNN_LIBRARY, else the library the build found, else the loader's search
 * path) and stays open. Each thread has a cuDNN handle per device, bound to its current stream,
 * and a table of FSDP_CUDA_SDPA_CACHE_SLOTS execution plans per device keyed by direction and
 * shape, the least recently used replaced when full (a plan is made with the thread's handle,
 * so plans are not shared between threads). A shape cuDNN refuses is cached as refused: the
 * caller runs another path. The f32 entries convert q, k, v (and out, dout) to bf16 on the
 * stream, run the bf16 graph, and widen out (dq, dk, dv) back: the conversions are part of their
 * cost. lse stays f32 in the table's layout (B, NH, T), which is cuDNN's statistics tensor. */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

#ifndef FSDP_HAVE_CUDNN

static void no_cudnn(char *why, size_t why_size) {
    if (why && why_size > 0)
        snprintf(why, why_size,
                 "this libfsdp was built without cuDNN (CMake found no cuDNN 9 header, or "
                 "FSDP_CUDNN=OFF): rebuild with cuDNN 9 (CUDNN_ROOT) to use it");
}

size_t fsdp_cuda_cudnn_version(char *why, size_t why_size) {
    no_cudnn(why, why_size);
    return 0;
}

size_t fsdp_cuda_cudnn_try_open(const char *path, char *why, size_t why_size) {
    (void)path;
    no_cudnn(why, why_size);
    return 0;
}

bool fsdp_cuda_sdpa_check_ops(bool backward, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t D, char *why, size_t why_size) {
    (void)backward, (void)B, (void)T, (void)NH, (void)NKV, (void)D;
    no_cudnn(why, why_size);
    return false;
}

bool fsdp_cuda_sdpa_forward_bf16(fsdp_bf16 *out, float *lse, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                 const fsdp_bf16 *v, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                 int64_t D) {
    (void)out, (void)lse, (void)q, (void)k, (void)v, (void)B, (void)T, (void)NH, (void)NKV, (void)D;
    return false;
}

bool fsdp_cuda_sdpa_backward_bf16(fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv,
                                  const fsdp_bf16 *dout, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                  const fsdp_bf16 *v, const fsdp_bf16 *out, const float *lse,
                                  int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse;
    (void)B, (void)T, (void)NH, (void)NKV, (void)D;
    return false;
}

bool fsdp_cuda_sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                            int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    (void)out, (void)lse, (void)q, (void)k, (void)v, (void)B, (void)T, (void)NH, (void)NKV, (void)D;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fsdp_cuda_sdpa_log_absent);
    return false;
}

bool fsdp_cuda_sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *out, const float *lse,
                             int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse;
    (void)B, (void)T, (void)NH, (void)NKV, (void)D;
    return false;
}

void fsdp_cuda_sdpa_log_absent(void) {
    char why[256];
    no_cudnn(why, sizeof why);
    fprintf(stderr, "libfsdp: cuDNN's fused attention: %s; the tiled attention runs instead\n",
            why);
}

fsdp_cuda_sdpa_stats fsdp_cuda_sdpa_stats_get(void) {
    return (fsdp_cuda_sdpa_stats){0};
}

#else

#include <dlfcn.h>

#include "kernels/cuda/sdpa_impl.h"

/* ---- the library ---- */

/* Opens path and resolves the functions; 0 and why on failure (the library is closed again). */
static size_t lib_open(const char *path, fsdp_cudnn_lib *lib, char *why, size_t why_size) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, why_size,
                 "cannot open the cuDNN library %s (%s): install cuDNN 9, or set "
                 "FSDP_CUDNN_LIBRARY to its libcudnn.so.9",
                 path, dlerror());
        return 0;
    }
    memset(lib, 0, sizeof *lib);
    const struct {
        const char *name;
        void *slot;
    } fns[] = {
        {"cudnnGetVersion", &lib->GetVersion},
        {"cudnnGetErrorString", &lib->GetErrorString},
        {"cudnnGetLastErrorString", &lib->GetLastErrorString},
        {"cudnnCreate", &lib->Create},
        {"cudnnDestroy", &lib->Destroy},
        {"cudnnSetStream", &lib->SetStream},
        {"cudnnBackendCreateDescriptor", &lib->BackendCreateDescriptor},
        {"cudnnBackendDestroyDescriptor", &lib->BackendDestroyDescriptor},
        {"cudnnBackendFinalize", &lib->BackendFinalize},
        {"cudnnBackendSetAttribute", &lib->BackendSetAttribute},
        {"cudnnBackendGetAttribute", &lib->BackendGetAttribute},
        {"cudnnBackendExecute", &lib->BackendExecute},
    };
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
        void *f = dlsym(h, fns[i].name);
        if (!f) {
            snprintf(why, why_size,
                     "the cuDNN library %s has no %s (cuDNN 9 is needed): install cuDNN 9, or "
                     "set FSDP_CUDNN_LIBRARY to its libcudnn.so.9",
                     path, fns[i].name);
            dlclose(h);
            return 0;
        }
        memcpy(fns[i].slot, &f, sizeof f);
    }
    lib->version = lib->GetVersion();
    if (lib->version / 10000 != 9) {
        snprintf(why, why_size,
                 "the cuDNN library %s is version %zu, and libfsdp was built for cuDNN 9: set "
                 "FSDP_CUDNN_LIBRARY to a libcudnn.so.9",
                 path, lib->version);
        dlclose(h);
        return 0;
    }
    return lib->version;
}

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static fsdp_cudnn_lib the_lib;
static char lib_why[512];

static void lib_load(void) {
    const char *env = getenv("FSDP_CUDNN_LIBRARY");
    if (env && *env) {
        lib_open(env, &the_lib, lib_why, sizeof lib_why);
        return;
    }
    if (lib_open(FSDP_CUDNN_DEFAULT_LIBRARY, &the_lib, lib_why, sizeof lib_why)) return;
    char first[512];
    snprintf(first, sizeof first, "%s", lib_why);
    if (!lib_open("libcudnn.so.9", &the_lib, lib_why, sizeof lib_why))
        snprintf(lib_why, sizeof lib_why, "%s", first); // the build's library says more
}

/* The opened library, or NULL with the reason in why. */
static const fsdp_cudnn_lib *lib_get(char *why, size_t why_size) {
    pthread_once(&lib_once, lib_load);
    if (the_lib.version) return &the_lib;
    if (why && why_size > 0) snprintf(why, why_size, "%s", lib_why);
    return NULL;
}

size_t fsdp_cuda_cudnn_version(char *why, size_t why_size) {
    const fsdp_cudnn_lib *lib = lib_get(why, why_size);
    return lib ? lib->version : 0;
}

size_t fsdp_cuda_cudnn_try_open(const char *path, char *why, size_t why_size) {
    fsdp_cudnn_lib lib;
    char buf[512];
    size_t v = lib_open(path, &lib, buf, sizeof buf);
    if (!v && why && why_size > 0) snprintf(why, why_size, "%s", buf);
    return v; // a library that opened stays open, as the one in use does
}

bool fsdp_cuda_sdpa_check_ops(bool backward, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t D, char *why, size_t why_size) {
    const fsdp_cudnn_lib *lib = lib_get(why, why_size);
    if (!lib) return false;
    return fsdp_sdpa_ops_check(lib, backward, B, T, NH, NKV, D, why, why_size) ==
           CUDNN_STATUS_SUCCESS;
}

void fsdp_cuda_sdpa_log_absent(void) {
    char why[512];
    if (!lib_get(why, sizeof why))
        fprintf(stderr, "libfsdp: cuDNN's fused attention: %s; the tiled attention runs instead\n",
                why);
}

/* ---- this thread's handles and plans ---- */

typedef struct sdpa_key {
    bool backward;
    int64_t B, T, NH, NKV, D;
} sdpa_key;

typedef struct sdpa_slot {
    sdpa_key key;
    uint64_t used_at;
    bool refused;     // cuDNN had no plan: the caller runs another path
    cudaEvent_t done; // recorded after each run of the plan (NULL before the first)
    fsdp_sdpa_plan plan;
} sdpa_slot;

typedef struct sdpa_device {
    cudnnHandle_t handle;
    bool unusable;   // cudnnCreate failed here: every call runs another path
    cudaStream_t on; // the stream the handle is bound to
    uint64_t clock;
    int used;
    sdpa_slot slot[FSDP_CUDA_SDPA_CACHE_SLOTS];
    fsdp_cuda_sdpa_stats stats;
} sdpa_device;

typedef struct sdpa_thread {
    sdpa_device *dev[FSDP_CUDA_MAX_DEVICES];
} sdpa_thread;

/* Frees a slot's plan after its last run (which may still be queued) has finished. */
static void slot_clear(sdpa_slot *s) {
    if (s->done) {
        fsdp_cuda_count_host_wait(-1);
        cudaEventSynchronize(s->done);
        cudaEventDestroy(s->done);
        s->done = NULL;
    }
    fsdp_sdpa_plan_free(&the_lib, &s->plan);
}

static void thread_release(void *state) {
    sdpa_thread *t = state;
    int keep = 0;
    if (cudaGetDevice(&keep) != cudaSuccess) keep = -1;
    for (int d = 0; d < FSDP_CUDA_MAX_DEVICES; d++) {
        sdpa_device *sd = t->dev[d];
        if (!sd) continue;
        cudaSetDevice(d);
        for (int i = 0; i < sd->used; i++) slot_clear(&sd->slot[i]);
        if (sd->handle) the_lib.Destroy(sd->handle);
        free(sd);
    }
    if (keep >= 0) cudaSetDevice(keep);
    (void)cudaGetLastError();
    free(t);
}

/* This thread's state on the current device, its handle on `stream`; NULL where cuDNN cannot
 * make a handle on the device (said once per thread and device). */
static sdpa_device *device_state(int device, cudaStream_t stream) {
    void **slot = fsdp_cuda_thread_sdpa(thread_release);
    if (!*slot) {
        *slot = calloc(1, sizeof(sdpa_thread));
        FSDP_ASSERT(*slot);
    }
    sdpa_thread *t = *slot;
    if (!t->dev[device]) {
        t->dev[device] = calloc(1, sizeof(sdpa_device));
        FSDP_ASSERT(t->dev[device]);
    }
    sdpa_device *sd = t->dev[device];
    if (sd->unusable) return NULL;
    if (!sd->handle) {
        cudnnStatus_t st = the_lib.Create(&sd->handle);
        if (st != CUDNN_STATUS_SUCCESS) {
            char detail[256] = "";
            the_lib.GetLastErrorString(detail, sizeof detail);
            fprintf(stderr,
                    "libfsdp: cuDNN's fused attention: cudnnCreate on cuda:%d failed: %s (%s); "
                    "the tiled attention runs instead\n",
                    device, the_lib.GetErrorString(st), detail);
            sd->handle = NULL;
            sd->unusable = true;
            (void)cudaGetLastError();
            return NULL;
        }
        sd->on = NULL;
    }
    if (sd->on != stream || !sd->on) {
        cudnnStatus_t st = the_lib.SetStream(sd->handle, stream);
        if (st != CUDNN_STATUS_SUCCESS) {
            fprintf(stderr, "libfsdp: cuDNN error: cudnnSetStream failed: %s\n",
                    the_lib.GetErrorString(st));
            abort();
        }
        sd->on = stream;
    }
    return sd;
}

static bool key_equal(const sdpa_key *a, const sdpa_key *b) {
    return a->backward == b->backward && a->B == b->B && a->T == b->T && a->NH == b->NH &&
           a->NKV == b->NKV && a->D == b->D;
}

/* Why cuDNN's fused attention cannot take the shape (NULL: it may). */
static const char *shape_refusal(const sdpa_key *k) {
    if (k->D % 8 != 0 || k->D > 128)
        return "cuDNN's fused attention needs a head dimension that is a multiple of 8 and at "
               "most 128";
    if (k->B * k->NH * k->T * k->D > INT32_MAX || k->B * k->NH * k->T > INT32_MAX)
        return "the tensors are larger than cuDNN's 32-bit element counts";
    return NULL;
}

/* The slot of key: cached, or built now (in a free slot or over the least recently used). */
static sdpa_slot *slot_for(sdpa_device *sd, cudnnHandle_t handle, const sdpa_key *key) {
    for (int i = 0; i < sd->used; i++)
        if (key_equal(&sd->slot[i].key, key)) {
            sd->slot[i].used_at = ++sd->clock;
            sd->stats.hits++;
            return &sd->slot[i];
        }
    int at = sd->used;
    if (at == FSDP_CUDA_SDPA_CACHE_SLOTS) {
        at = 0;
        for (int i = 1; i < FSDP_CUDA_SDPA_CACHE_SLOTS; i++)
            if (sd->slot[i].used_at < sd->slot[at].used_at) at = i;
        slot_clear(&sd->slot[at]);
        sd->stats.evictions++;
    } else {
        sd->used++;
    }
    sdpa_slot *s = &sd->slot[at];
    memset(s, 0, sizeof *s);
    s->key = *key;
    s->used_at = ++sd->clock;
    sd->stats.builds++;
    char why[512];
    const char *refusal = shape_refusal(key);
    if (refusal)
        snprintf(why, sizeof why, "%s", refusal);
    else if (fsdp_sdpa_plan_build(&the_lib, handle, key->backward, key->B, key->T, key->NH,
                                  key->NKV, key->D, &s->plan, why,
                                  sizeof why) == CUDNN_STATUS_SUCCESS)
        return s;
    s->refused = true;
    sd->stats.refusals++;
    fprintf(stderr,
            "libfsdp: cuDNN's fused attention: cuDNN refuses the attention %s of B %lld T %lld "
            "NH %lld NKV %lld D %lld (%s); the tiled attention runs it instead\n",
            key->backward ? "backward" : "forward", (long long)key->B, (long long)key->T,
            (long long)key->NH, (long long)key->NKV, (long long)key->D, why);
    return s;
}

fsdp_cuda_sdpa_stats fsdp_cuda_sdpa_stats_get(void) {
    int device = 0;
    FSDP_CUDA_CHECK(cudaGetDevice(&device));
    void **slot = fsdp_cuda_thread_sdpa(thread_release);
    sdpa_thread *t = *slot;
    fsdp_cuda_sdpa_stats s = {0};
    if (t && t->dev[device]) {
        s = t->dev[device]->stats;
        s.slots_used = t->dev[device]->used;
    }
    return s;
}

/* ---- running a plan ---- */

/* Where a call runs: this thread's state on its current device and the slot of the call's key. */
typedef struct sdpa_call {
    sdpa_device *sd;
    sdpa_slot *slot;
    int device;
} sdpa_call;

/* The call of key, false where there is no plan (no cuDNN, or it refused the shape). */
static bool call_of(const sdpa_key *key, sdpa_call *c) {
    if (key->B <= 0 || key->T <= 0 || key->NH <= 0 || key->NKV <= 0 || key->D <= 0) return false;
    static pthread_once_t logged = PTHREAD_ONCE_INIT;
    if (!lib_get(NULL, 0)) {
        pthread_once(&logged, fsdp_cuda_sdpa_log_absent);
        return false;
    }
    FSDP_CUDA_CHECK(cudaGetDevice(&c->device));
    c->sd = device_state(c->device, fsdp_cuda_stream());
    if (!c->sd) return false;
    c->slot = slot_for(c->sd, c->sd->handle, key);
    return !c->slot->refused;
}

static void log_unaligned(void) {
    fprintf(stderr,
            "libfsdp: cuDNN's fused attention: a tensor is not %d-byte aligned, which its "
            "plans assume; the tiled attention runs such calls instead\n",
            SDPA_ALIGN);
}

/* Whether the n device pointers a call would hand cuDNN are all SDPA_ALIGN-byte aligned: the
 * plan cache's key has no alignment, every plan assumes it. Where one is not (a view at an
 * offset), the call runs another path, said once per process. */
static bool aligned(int n, const void *const *ptr) {
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ptr[i] % SDPA_ALIGN != 0) {
            static pthread_once_t logged = PTHREAD_ONCE_INIT;
            pthread_once(&logged, log_unaligned);
            return false;
        }
    return true;
}

/* Runs the call's plan with the tensors (uids[i] at ptrs[i]) and a workspace from the
 * allocator, on the thread's current stream. */
static void execute(const sdpa_call *c, int n, const int64_t *uids, void **ptrs) {
    const fsdp_sdpa_plan *p = &c->slot->plan;
    int device = c->device;
    void *ws = NULL;
    if (p->workspace > 0 &&
        fsdp_cuda_block_alloc(NULL, device, (size_t)p->workspace, &ws) != FSDP_OK) {
        fprintf(stderr,
                "libfsdp: cannot allocate cuDNN's attention workspace (%lld bytes) on cuda:%d: "
                "free device memory, or set FSDP_CUDA_ATTENTION=flash\n",
                (long long)p->workspace, device);
        abort();
    }
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = the_lib.BackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = the_lib.BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                         n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = the_lib.BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                         CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = the_lib.BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                         1, &ws);
    if (st == CUDNN_STATUS_SUCCESS) st = the_lib.BackendFinalize(vp);
    if (st == CUDNN_STATUS_SUCCESS) st = the_lib.BackendExecute(c->sd->handle, p->plan, vp);
    if (st == CUDNN_STATUS_SUCCESS) fsdp_cuda_count_launch(c->device);
    if (vp) the_lib.BackendDestroyDescriptor(vp);
    if (st != CUDNN_STATUS_SUCCESS) {
        char detail[256] = "";
        the_lib.GetLastErrorString(detail, sizeof detail);
        fprintf(stderr, "libfsdp: cuDNN error: running the fused attention failed: %s (%s)\n",
                the_lib.GetErrorString(st), detail);
        abort();
    }
    fsdp_cuda_block_free(device, ws); // after the run on this stream (the allocator's event)
    if (!c->slot->done)
        FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&c->slot->done, cudaEventDisableTiming));
    FSDP_CUDA_CHECK(cudaEventRecord(c->slot->done, fsdp_cuda_stream()));
}

static void run_forward(const sdpa_call *c, fsdp_bf16 *out, float *lse, const fsdp_bf16 *q,
                        const fsdp_bf16 *k, const fsdp_bf16 *v, int64_t D) {
    float scale = 1.0f / sqrtf((float)D), neg = -FLT_MAX;
    int64_t uids[] = {SDPA_Q, SDPA_K, SDPA_V, SDPA_O, SDPA_STATS, SDPA_SCALE, SDPA_NEG};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, out, lse, &scale, &neg};
    execute(c, 7, uids, ptrs);
}

static void run_backward(const sdpa_call *c, fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv,
                         const fsdp_bf16 *dout, const fsdp_bf16 *q, const fsdp_bf16 *k,
                         const fsdp_bf16 *v, const fsdp_bf16 *out, const float *lse,
                         const sdpa_key *key) {
    size_t acc_bytes = (size_t)(key->B * key->NH * key->T * key->D) * sizeof(float);
    void *acc = NULL;
    if (fsdp_cuda_block_alloc(NULL, c->device, acc_bytes, &acc) != FSDP_OK) {
        fprintf(stderr,
                "libfsdp: cannot allocate the attention backward's f32 dq (%zu bytes) on cuda:%d: "
                "free device memory, or set FSDP_CUDA_ATTENTION=flash\n",
                acc_bytes, c->device);
        abort();
    }
    FSDP_CUDA_CHECK(cudaMemsetAsync(acc, 0, acc_bytes, fsdp_cuda_stream())); // accumulated into
    fsdp_cuda_count_launch(c->device);
    float scale = 1.0f / sqrtf((float)key->D), neg = -FLT_MAX, one = 1.0f;
    int64_t uids[] = {SDPA_Q,   SDPA_K,   SDPA_V,  SDPA_O,  SDPA_DO, SDPA_STATS,   SDPA_SCALE,
                      SDPA_NEG, SDPA_ONE, SDPA_DQ, SDPA_DK, SDPA_DV, SDPA_DQ_ACCUM};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, (void *)out, (void *)dout, (void *)lse, &scale,
                    &neg,      &one,      dq,        dk,          dv,           acc};
    execute(c, 13, uids, ptrs);
    fsdp_cuda_block_free(c->device, acc);
}

bool fsdp_cuda_sdpa_forward_bf16(fsdp_bf16 *out, float *lse, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                 const fsdp_bf16 *v, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                 int64_t D) {
    sdpa_key key = {false, B, T, NH, NKV, D};
    sdpa_call c;
    const void *t[] = {out, lse, q, k, v};
    if (!aligned(5, t) || !call_of(&key, &c)) return false;
    run_forward(&c, out, lse, q, k, v, D);
    return true;
}

bool fsdp_cuda_sdpa_backward_bf16(fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv,
                                  const fsdp_bf16 *dout, const fsdp_bf16 *q, const fsdp_bf16 *k,
                                  const fsdp_bf16 *v, const fsdp_bf16 *out, const float *lse,
                                  int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    sdpa_key key = {true, B, T, NH, NKV, D};
    sdpa_call c;
    const void *t[] = {dq, dk, dv, dout, q, k, v, out, lse};
    if (!aligned(9, t) || !call_of(&key, &c)) return false;
    run_backward(&c, dq, dk, dv, dout, q, k, v, out, lse, &key);
    return true;
}

/* ---- the f32 entries: bf16 at the boundary ---- */

/* One block from the allocator holding n bf16 arrays of the given lengths, each 256-byte
 * aligned; parts[i] point into it. */
static void *bf16_block(int n, const int64_t *len, fsdp_bf16 **parts) {
    int device = 0;
    FSDP_CUDA_CHECK(cudaGetDevice(&device));
    size_t off[8], total = 0;
    for (int i = 0; i < n; i++) {
        off[i] = total;
        total += ((size_t)len[i] * sizeof(fsdp_bf16) + 255) & ~(size_t)255;
    }
    void *block = NULL;
    if (fsdp_cuda_block_alloc(NULL, device, total, &block) != FSDP_OK) {
        fprintf(stderr,
                "libfsdp: cannot allocate the attention's bf16 copies (%zu bytes) on cuda:%d: free "
                "device memory, or set FSDP_CUDA_ATTENTION=flash\n",
                total, device);
        abort();
    }
    for (int i = 0; i < n; i++) parts[i] = (fsdp_bf16 *)((char *)block + off[i]);
    return block;
}

static void block_release(void *block) {
    int device = 0;
    FSDP_CUDA_CHECK(cudaGetDevice(&device));
    fsdp_cuda_block_free(device, block);
}

bool fsdp_cuda_sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                            int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    sdpa_key key = {false, B, T, NH, NKV, D};
    sdpa_call c;
    const void *t[] = {lse}; // the other tensors cuDNN sees are this call's aligned copies
    if (!aligned(1, t) || !call_of(&key, &c)) return false; // or no cuDNN, or it refused the shape
    int64_t nq = B * T * NH * D, nk = B * T * NKV * D, len[4] = {nq, nk, nk, nq};
    fsdp_bf16 *b[4];
    void *block = bf16_block(4, len, b);
    fsdp_cuda_f32_to_bf16(b[0], q, nq);
    fsdp_cuda_f32_to_bf16(b[1], k, nk);
    fsdp_cuda_f32_to_bf16(b[2], v, nk);
    run_forward(&c, b[3], lse, b[0], b[1], b[2], D);
    fsdp_cuda_bf16_to_f32(out, b[3], nq);
    block_release(block);
    return true;
}

bool fsdp_cuda_sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *out, const float *lse,
                             int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D) {
    sdpa_key key = {true, B, T, NH, NKV, D};
    sdpa_call c;
    const void *t[] = {lse};
    if (!aligned(1, t) || !call_of(&key, &c)) return false;
    int64_t nq = B * T * NH * D, nk = B * T * NKV * D;
    int64_t len[8] = {nq, nk, nk, nq, nq, nq, nk, nk}; // q k v out dout | dq dk dv
    fsdp_bf16 *b[8];
    void *block = bf16_block(8, len, b);
    fsdp_cuda_f32_to_bf16(b[0], q, nq);
    fsdp_cuda_f32_to_bf16(b[1], k, nk);
    fsdp_cuda_f32_to_bf16(b[2], v, nk);
    fsdp_cuda_f32_to_bf16(b[3], out, nq);
    fsdp_cuda_f32_to_bf16(b[4], dout, nq);
    run_backward(&c, b[5], b[6], b[7], b[4], b[0], b[1], b[2], b[3], lse, &key);
    fsdp_cuda_bf16_to_f32(dq, b[5], nq);
    fsdp_cuda_bf16_to_f32(dk, b[6], nk);
    fsdp_cuda_bf16_to_f32(dv, b[7], nk);
    block_release(block);
    return true;
}

#endif
