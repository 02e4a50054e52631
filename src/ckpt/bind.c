/* bind.c: the checkpoint id, XXH64 digests of piece values, and the attributes that bind a
 * shard file to its checkpoint (see bind.h). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "ckpt/bind.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/h5.h"
#include "core/error.h"

/* ---- ids ---- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

ckpt_id ckpt_id_new(void) {
    uint64_t w[2] = {0, 0};
    int fd = open("/dev/urandom", O_RDONLY);
    bool got = fd >= 0 && read(fd, w, sizeof w) == (ssize_t)sizeof w;
    if (fd >= 0) close(fd);
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    seed ^= (uint64_t)getpid() << 32 ^ __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    if (!got) w[0] = splitmix(&seed), w[1] = splitmix(&seed);
    if (!w[0] && !w[1]) w[1] = 1;
    return (ckpt_id){w[0], w[1]};
}

void ckpt_id_format(ckpt_id id, char buf[CKPT_ID_CHARS + 1]) {
    snprintf(buf, CKPT_ID_CHARS + 1, "%016llx%016llx", (unsigned long long)id.hi,
             (unsigned long long)id.lo);
}

bool ckpt_id_parse(const char *s, ckpt_id *out) {
    uint64_t w[2] = {0, 0};
    for (int i = 0; i < CKPT_ID_CHARS; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0) return false;
        w[i / 16] = w[i / 16] << 4 | (uint64_t)v;
    }
    if (s[CKPT_ID_CHARS]) return false;
    *out = (ckpt_id){w[0], w[1]};
    return true;
}

/* ---- XXH64 (Yann Collet's xxHash, 64-bit, seed 0) ---- */

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static uint64_t rotl(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}
static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t xround(uint64_t acc, uint64_t in) {
    return rotl(acc + in * P2, 31) * P1;
}
static uint64_t merge(uint64_t h, uint64_t v) {
    return (h ^ xround(0, v)) * P1 + P4;
}

void ckpt_digest_init(ckpt_digest *d) {
    *d = (ckpt_digest){.v = {P1 + P2, P2, 0, 0 - P1}};
}

static void stripe(ckpt_digest *d, const unsigned char *p) {
    for (int i = 0; i < 4; i++) d->v[i] = xround(d->v[i], le64(p + 8 * i));
}

/* Adds bytes in file order. */
static void digest_bytes(ckpt_digest *d, const unsigned char *p, size_t n) {
    d->total += n;
    if (d->n) {
        size_t take = n < 32 - d->n ? n : 32 - d->n;
        memcpy(d->buf + d->n, p, take);
        d->n += take, p += take, n -= take;
        if (d->n < 32) return;
        stripe(d, d->buf);
        d->n = 0;
    }
    for (; n >= 32; p += 32, n -= 32) stripe(d, p);
    memcpy(d->buf, p, n);
    d->n = n;
}

static bool host_little_endian(void) {
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

void ckpt_digest_values(ckpt_digest *d, const void *values, size_t n, size_t elem) {
    if (host_little_endian() || elem == 1) {
        digest_bytes(d, values, n * elem);
        return;
    }
    unsigned char block[4096];
    const unsigned char *src = values;
    size_t per = sizeof block / elem;
    for (size_t at = 0; at < n; at += per) {
        size_t k = n - at < per ? n - at : per;
        for (size_t i = 0; i < k; i++)
            for (size_t b = 0; b < elem; b++)
                block[i * elem + b] = src[(at + i) * elem + elem - 1 - b];
        digest_bytes(d, block, k * elem);
    }
}

uint64_t ckpt_digest_final(const ckpt_digest *d) {
    uint64_t h;
    if (d->total >= 32) {
        h = rotl(d->v[0], 1) + rotl(d->v[1], 7) + rotl(d->v[2], 12) + rotl(d->v[3], 18);
        for (int i = 0; i < 4; i++) h = merge(h, d->v[i]);
    } else {
        h = d->v[2] + P5; /* the seed */
    }
    h += d->total;
    const unsigned char *p = d->buf;
    size_t n = d->n;
    for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ xround(0, le64(p)), 27) * P1 + P4;
    if (n >= 4) {
        uint64_t k =
            (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
        h = rotl(h ^ k * P1, 23) * P2 + P3;
        p += 4, n -= 4;
    }
    for (; n; p++, n--) h = rotl(h ^ *p * P5, 11) * P1;
    h ^= h >> 33, h *= P2, h ^= h >> 29, h *= P3, h ^= h >> 32;
    return h;
}

/* ---- shard attributes ---- */

fsdp_status ckpt_shard_bind(fsdp_ctx *ctx, hid_t file, ckpt_id id, int rank) {
    char text[CKPT_ID_CHARS + 1];
    ckpt_id_format(id, text);
    FSDP_TRY_AT(ctx, h5_attr_write_str(ctx, file, CKPT_ID_ATTR, text));
    return h5_attr_write_i64(ctx, file, CKPT_RANK_ATTR, rank);
}

fsdp_status ckpt_shard_check(fsdp_ctx *ctx, hid_t file, const char *name, int rank, ckpt_id id) {
    char want[CKPT_ID_CHARS + 1], *text = NULL;
    ckpt_id_format(id, want);
    htri_t has = H5Aexists(file, CKPT_ID_ATTR);
    H5Eclear2(H5E_DEFAULT);
    if (has <= 0)
        return FSDP_FAIL(ctx, FSDP_ERR_IO,
                         "%s has no checkpoint id, but its metadata.h5 (format 2, id %s) binds "
                         "every shard to it: the shard was written by an older libfsdp or comes "
                         "from another save; restore the shard from the same save or use another "
                         "checkpoint",
                         name, want);
    ckpt_id got;
    fsdp_status s = h5_attr_read_str(ctx, file, CKPT_ID_ATTR, CKPT_ID_CHARS, &text);
    if (s == FSDP_OK && !ckpt_id_parse(text, &got))
        s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                      "%s: its checkpoint id '%.40s' is not 32 hex digits (damaged); restore the "
                      "shard from the same save or use another checkpoint",
                      name, text);
    if (s == FSDP_OK && (got.hi != id.hi || got.lo != id.lo))
        s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                      "%s belongs to another checkpoint (id %s, metadata.h5 says %s): the "
                      "directory mixes files of two saves; restore the shard from the same save "
                      "(or metadata.h5, if it is the one replaced) or use the other step",
                      name, text, want);
    free(text);
    int64_t r = -1;
    if (s == FSDP_OK) s = h5_attr_read_i64(ctx, file, CKPT_RANK_ATTR, &r);
    if (s == FSDP_OK && r != rank)
        s = FSDP_FAIL(ctx, FSDP_ERR_IO,
                      "%s was written by rank %lld of its save, not rank %d (renamed?): put each "
                      "shard back under its own name",
                      name, (long long)r, rank);
    return FSDP_PASS(ctx, s);
}
