/* train_tensorboard.c: writes TensorBoard event files of scalars: TFRecords with masked
 * CRC-32C, each an Event protocol buffer encoded by hand (varints, fixed 32/64-bit fields,
 * length-delimited strings and messages). */
#define _POSIX_C_SOURCE 200809L // gethostname, clock_gettime, fileno, fdopen

#include "train_tensorboard.h"

#include <errno.h>
#include <fcntl.h>   // defines: open, O_EXCL
#include <pthread.h> // defines: pthread_once
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> // defines: mkdir, stat
#include <time.h>     // defines: clock_gettime
#include <unistd.h>   // defines: gethostname, close

struct tb_writer {
    FILE *f;
    char path[4096];
    char error[4400];
};

/* ---- CRC-32C ----------------------------------------------------------------------------- */

static uint32_t g_crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        g_crc_table[i] = c;
    }
}

uint32_t tb_crc32c(const void *data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = g_crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t tb_masked_crc(const void *data, size_t n) {
    uint32_t c = tb_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protocol buffer encoding ------------------------------------------------------------ */

/* A message being encoded into a fixed buffer; `over` when it did not fit. */
typedef struct pb {
    unsigned char *b;
    size_t n, cap;
    int over;
} pb;

static void pb_byte(pb *m, unsigned char c) {
    if (m->n < m->cap)
        m->b[m->n++] = c;
    else
        m->over = 1;
}

static void pb_varint(pb *m, uint64_t v) {
    do {
        pb_byte(m, (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
        v >>= 7;
    } while (v);
}

static void pb_key(pb *m, int field, int wire) {
    pb_varint(m, (uint64_t)field << 3 | (uint64_t)wire);
}

static void pb_fixed(pb *m, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) pb_byte(m, (unsigned char)(v >> (8 * i)));
}

static void pb_bytes(pb *m, int field, const void *data, size_t n) {
    pb_key(m, field, 2);
    pb_varint(m, n);
    for (size_t i = 0; i < n; i++) pb_byte(m, ((const unsigned char *)data)[i]);
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };
enum { EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5 };
enum { SUMMARY_VALUE = 1, VALUE_TAG = 1, VALUE_SIMPLE_VALUE = 2 };

/* Event header fields: wall_time, and step when not 0 (proto3 leaves defaults out). */
static void event_head(pb *m, double wall_time, int64_t step) {
    uint64_t bits;
    memcpy(&bits, &wall_time, sizeof bits);
    pb_key(m, EVENT_WALL_TIME, WIRE_FIXED64);
    pb_fixed(m, bits, 8);
    if (step != 0) {
        pb_key(m, EVENT_STEP, WIRE_VARINT);
        pb_varint(m, (uint64_t)step); /* int64: two's complement, 10 bytes when negative */
    }
}

/* ---- records ----------------------------------------------------------------------------- */

static fsdp_status set_error(tb_writer *w, fsdp_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
    return st;
}

static fsdp_status write_record(tb_writer *w, const unsigned char *data, size_t n) {
    unsigned char head[12], tail[4];
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)n >> (8 * i));
    uint32_t c = tb_masked_crc(head, 8), d = tb_masked_crc(data, n);
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(c >> (8 * i));
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(d >> (8 * i));
    if (fwrite(head, 1, sizeof head, w->f) != sizeof head || fwrite(data, 1, n, w->f) != n ||
        fwrite(tail, 1, sizeof tail, w->f) != sizeof tail)
        return set_error(w, FSDP_ERR_IO, "cannot write to TensorBoard event file '%s': %s", w->path,
                         strerror(errno));
    return FSDP_OK;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

fsdp_status tb_scalar_at(tb_writer *w, const char *tag, int64_t step, double value,
                         double wall_time) {
    if (!w) return FSDP_ERR_INVALID_ARGUMENT;
    size_t len = tag ? strlen(tag) : 0;
    if (len == 0 || len > TB_MAX_TAG)
        return set_error(w, FSDP_ERR_INVALID_ARGUMENT,
                         "a TensorBoard tag is 1 to %d bytes; got %zu bytes%s%.40s%s", TB_MAX_TAG,
                         len, len ? " ('" : "", len ? tag : "", len ? "...')" : "");
    unsigned char vbuf[TB_MAX_TAG + 32], sbuf[TB_MAX_TAG + 48], ebuf[TB_MAX_TAG + 96];
    pb v = {vbuf, 0, sizeof vbuf, 0}, s = {sbuf, 0, sizeof sbuf, 0}, e = {ebuf, 0, sizeof ebuf, 0};
    float f = (float)value;
    uint32_t fbits;
    memcpy(&fbits, &f, sizeof fbits);
    pb_bytes(&v, VALUE_TAG, tag, len);
    pb_key(&v, VALUE_SIMPLE_VALUE, WIRE_FIXED32);
    pb_fixed(&v, fbits, 4);
    pb_bytes(&s, SUMMARY_VALUE, vbuf, v.n);
    event_head(&e, wall_time, step);
    pb_bytes(&e, EVENT_SUMMARY, sbuf, s.n);
    if (v.over || s.over || e.over) /* the buffers are sized for the longest tag */
        return set_error(w, FSDP_ERR_INTERNAL, "a TensorBoard event did not fit its buffer");
    return write_record(w, ebuf, e.n);
}

fsdp_status tb_scalar(tb_writer *w, const char *tag, int64_t step, double value) {
    return tb_scalar_at(w, tag, step, value, now());
}

/* ---- files ------------------------------------------------------------------------------- */

/* mkdir -p: each missing component of path, in order. */
static int make_dirs(const char *path) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return ENAMETOOLONG;
    for (char *s = p + 1;; s++) {
        char c = *s;
        if (c != '/' && c != '\0') continue;
        *s = '\0';
        struct stat sb;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) return errno;
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) return ENOTDIR;
        *s = c;
        if (c == '\0') return 0;
        while (s[1] == '/') s++;
        if (s[1] == '\0') return 0;
    }
}

/* Opens a new file DIR/events.out.tfevents.<seconds>.<host>[.k], never an existing one. */
static int open_new(tb_writer *w, const char *dir, char *err, size_t err_size) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    long long t = (long long)time(NULL);
    for (int k = 0; k < 1000; k++) {
        char suffix[16] = "";
        if (k) snprintf(suffix, sizeof suffix, ".%d", k);
        if (snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s%s", dir, t, host,
                     suffix) >= (int)sizeof w->path) {
            snprintf(err, err_size, "the TensorBoard directory path '%.200s...' is too long", dir);
            return -1;
        }
        int fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (fd >= 0) return fd;
        if (errno != EEXIST) break;
    }
    snprintf(err, err_size,
             "cannot create TensorBoard event file '%s': %s; give a directory this "
             "process can write",
             w->path, strerror(errno));
    return -1;
}

fsdp_status tb_open(const char *dir, tb_writer **out, char *err, size_t err_size) {
    *out = NULL;
    if (!dir || !dir[0]) {
        snprintf(err, err_size, "no TensorBoard directory given; name one (e.g. runs/tb)");
        return FSDP_ERR_INVALID_ARGUMENT;
    }
    int e = make_dirs(dir);
    if (e != 0) {
        snprintf(err, err_size,
                 "cannot make the TensorBoard directory '%s': %s; give a directory "
                 "this process can write",
                 dir, strerror(e));
        return FSDP_ERR_IO;
    }
    tb_writer *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, err_size, "out of memory for a TensorBoard writer");
        return FSDP_ERR_OUT_OF_MEMORY;
    }
    int fd = open_new(w, dir, err, err_size);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        if (fd >= 0) {
            snprintf(err, err_size, "cannot open '%s': %s", w->path, strerror(errno));
            close(fd);
        }
        free(w);
        return FSDP_ERR_IO;
    }
    unsigned char buf[64];
    pb m = {buf, 0, sizeof buf, 0};
    event_head(&m, now(), 0);
    pb_bytes(&m, EVENT_FILE_VERSION, TB_FILE_VERSION, strlen(TB_FILE_VERSION));
    fsdp_status st = write_record(w, buf, m.n);
    if (st == FSDP_OK) st = tb_flush(w);
    if (st != FSDP_OK) {
        snprintf(err, err_size, "%s", w->error);
        tb_close(w);
        return st;
    }
    *out = w;
    return FSDP_OK;
}

fsdp_status tb_flush(tb_writer *w) {
    if (!w) return FSDP_ERR_INVALID_ARGUMENT;
    if (fflush(w->f) != 0)
        return set_error(w, FSDP_ERR_IO, "cannot write to TensorBoard event file '%s': %s", w->path,
                         strerror(errno));
    return FSDP_OK;
}

fsdp_status tb_close(tb_writer *w) {
    if (!w) return FSDP_OK;
    fsdp_status st = tb_flush(w);
    if (fclose(w->f) != 0 && st == FSDP_OK) st = FSDP_ERR_IO;
    free(w);
    return st;
}

const char *tb_path(const tb_writer *w) {
    return w ? w->path : "";
}

const char *tb_last_error(const tb_writer *w) {
    return w ? w->error : "";
}
