/* nccl_lib.c: opening the NCCL library the nccl backend calls (dlopen), resolving the functions
 * it uses (dlsym) and naming it by its version, or as the stand-in NCCL when it carries the
 * stand-in's marker. Every library opened stays open for the life of the process:
 * communicators made from it may outlive a world until their streams drain. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/nccl_lib.h"
#include "core/error.h"

#define MAX_LIBS 4

static pthread_mutex_t lib_mu = PTHREAD_MUTEX_INITIALIZER;
static fsdp_nccl_lib libs[MAX_LIBS]; /* opened, under lib_mu; never closed */
static int n_libs;
static struct {
    bool set;
    char path[512];
    char name[64];
    fsdp_device_type device;
} choice; /* under lib_mu */

void fsdp_nccl_library_use(const char *path, const char *name, fsdp_device_type device) {
    pthread_mutex_lock(&lib_mu);
    choice.set = path != NULL;
    snprintf(choice.path, sizeof choice.path, "%s", path ? path : "");
    snprintf(choice.name, sizeof choice.name, "%s", name ? name : "");
    choice.device = device;
    pthread_mutex_unlock(&lib_mu);
}

/* Resolves one function into *slot; fails naming it when the library lacks it. */
static fsdp_status resolve(fsdp_ctx *ctx, void *handle, const char *path, const char *symbol,
                           void *slot) {
    void *f = dlsym(handle, symbol);
    if (!f)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "the NCCL library %s has no %s (NCCL 2.18 or newer is needed): install a "
                         "newer NCCL or point %s at one",
                         path, symbol, FSDP_NCCL_LIBRARY_ENV);
    memcpy(slot, &f, sizeof f);
    return FSDP_OK;
}

/* A stand-in's marker (FSDP_NCCL_STANDIN_SYMBOL) in h: *device <- the device kind it serves.
 * false when h has none (a real NCCL); a marker naming no device kind fails. */
static fsdp_status standin_marker(fsdp_ctx *ctx, void *h, const char *path, bool *standin,
                                  fsdp_device_type *device) {
    const int *kind = dlsym(h, FSDP_NCCL_STANDIN_SYMBOL);
    *standin = kind != NULL;
    if (!kind) return FSDP_OK;
    if (*kind != FSDP_DEVICE_CUDA && *kind != FSDP_DEVICE_SIM)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "the stand-in NCCL %s says it serves device kind %d, which is neither "
                         "cuda nor sim; rebuild it, or point %s at another library",
                         path, *kind, FSDP_NCCL_LIBRARY_ENV);
    *device = (fsdp_device_type)*kind;
    return FSDP_OK;
}

/* Opens path. device: the kind asked for; from_marker: a stand-in's marker decides it instead
 * (the library came from the environment or the build, not from fsdp_nccl_library_use). */
static fsdp_status open_lib(fsdp_ctx *ctx, const char *path, const char *name,
                            fsdp_device_type device, bool from_marker, fsdp_nccl_lib *lib) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                         "cannot open the NCCL library %s (%s): install NCCL, or set %s to its "
                         "libnccl.so.2",
                         path, dlerror(), FSDP_NCCL_LIBRARY_ENV);
    memset(lib, 0, sizeof *lib);
    snprintf(lib->path, sizeof lib->path, "%s", path);
    bool standin = false;
    fsdp_device_type marked = device;
    fsdp_status mst = standin_marker(ctx, h, path, &standin, &marked);
    if (mst != FSDP_OK) {
        dlclose(h);
        return FSDP_PASS(ctx, mst);
    }
    lib->device = from_marker ? marked : device;
    const struct {
        const char *symbol;
        void *slot;
    } table[] = {
        {"ncclGetVersion", &lib->GetVersion},
        {"ncclGetUniqueId", &lib->GetUniqueId},
        {"ncclCommInitRank", &lib->CommInitRank},
        {"ncclCommSplit", &lib->CommSplit},
        {"ncclCommDestroy", &lib->CommDestroy},
        {"ncclCommAbort", &lib->CommAbort},
        {"ncclCommGetAsyncError", &lib->CommGetAsyncError},
        {"ncclGetErrorString", &lib->GetErrorString},
        {"ncclAllGather", &lib->AllGather},
        {"ncclReduceScatter", &lib->ReduceScatter},
        {"ncclAllReduce", &lib->AllReduce},
        {"ncclBroadcast", &lib->Broadcast},
        {"ncclSend", &lib->Send},
        {"ncclRecv", &lib->Recv},
        {"ncclGroupStart", &lib->GroupStart},
        {"ncclGroupEnd", &lib->GroupEnd},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        fsdp_status st = resolve(ctx, h, path, table[i].symbol, table[i].slot);
        if (st != FSDP_OK) {
            dlclose(h);
            return FSDP_PASS(ctx, st);
        }
    }
    if (lib->GetVersion(&lib->version) != ncclSuccess) lib->version = 0;
    const int v = lib->version;
    /* NCCL's codes: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z since 2.9. */
    const int major = v >= 10000 ? v / 10000 : v / 1000;
    const int minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
    if (name && *name)
        snprintf(lib->name, sizeof lib->name, "%s", name);
    else if (standin)
        snprintf(lib->name, sizeof lib->name, "%s", FSDP_NCCL_STANDIN_NAME);
    else
        snprintf(lib->name, sizeof lib->name, "NCCL %d.%d.%d", major, minor, v % 100);
    return FSDP_OK;
}

/* Whether lib is the library (path, name: "" for its own, device: any when from_marker) asks
 * for. */
static bool same_lib(const fsdp_nccl_lib *lib, const char *path, const char *name,
                     fsdp_device_type device, bool from_marker) {
    return strncmp(lib->path, path, sizeof lib->path) == 0 &&
           (from_marker || lib->device == device) &&
           (!name[0] || strncmp(lib->name, name, sizeof lib->name) == 0);
}

fsdp_status fsdp_nccl_library_open(fsdp_ctx *ctx, const fsdp_nccl_lib **out) {
    *out = NULL;
    pthread_mutex_lock(&lib_mu);
    char path[512], name[64];
    fsdp_device_type device = FSDP_DEVICE_CUDA;
    const char *env = getenv(FSDP_NCCL_LIBRARY_ENV);
    snprintf(path, sizeof path, "%s",
             choice.set    ? choice.path
             : env && *env ? env
                           : FSDP_NCCL_DEFAULT_LIBRARY);
    snprintf(name, sizeof name, "%s", choice.set ? choice.name : "");
    if (choice.set) device = choice.device;
    const bool from_marker = !choice.set;
    fsdp_status st = FSDP_OK;
    for (int i = 0; i < n_libs && i < MAX_LIBS && !*out; i++)
        if (same_lib(&libs[i], path, name, device, from_marker)) *out = &libs[i];
    if (!*out && n_libs == MAX_LIBS)
        st = FSDP_FAIL(ctx, FSDP_ERR_UNSUPPORTED,
                       "a process opens at most %d NCCL libraries; %s would be one more", MAX_LIBS,
                       path);
    if (!*out && st == FSDP_OK) {
        st = open_lib(ctx, path, name, device, from_marker, &libs[n_libs]);
        if (st == FSDP_OK) *out = &libs[n_libs++];
    }
    pthread_mutex_unlock(&lib_mu);
    return FSDP_PASS(ctx, st);
}
