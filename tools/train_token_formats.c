/* train_token_formats.c: reads the header of a token file in one of the three formats
 * fsdp-train takes (its own, llm.c's .bin, NumPy's .npy), checks every field against the file's
 * size, and says where the ids lie and how each is stored. */
#include "train_token_formats.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static uint64_t le(const unsigned char *b, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

const char *train_token_format_name(train_token_format f) {
    switch (f) {
    case TRAIN_TOKEN_FORMAT_LLMC:
        return "llm.c .bin shard";
    case TRAIN_TOKEN_FORMAT_NPY:
        return ".npy array";
    default:
        return "token file";
    }
}

static fsdp_status fail(char *err, size_t err_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    return FSDP_ERR_CONFIG;
}

/* The ids fill the file after `offset` exactly: count * bytes == size - offset, without
 * overflow. */
static fsdp_status check_body(const char *name, const char *what, uint64_t count, int bytes,
                              int64_t offset, int64_t size, const char *fix, char *err,
                              size_t err_size) {
    int64_t body = size - offset;
    if (count > (uint64_t)body / (uint64_t)bytes || count * (uint64_t)bytes != (uint64_t)body)
        return fail(err, err_size,
                    "%s: its %s says %llu tokens of %d bytes, but the file has %lld bytes after "
                    "the %lld-byte header (%lld tokens and %lld bytes over): the count does not "
                    "match the size, so the file is truncated or was not written whole; %s",
                    name, what, (unsigned long long)count, bytes, (long long)body,
                    (long long)offset, (long long)(body / bytes), (long long)(body % bytes), fix);
    if (count == 0) return fail(err, err_size, "%s holds no tokens; tokenize a text into it", name);
    return FSDP_OK;
}

/* ---- fsdp-train's token file ------------------------------------------------------------- */

static fsdp_status read_fsdptok(const unsigned char *h, int64_t size, const char *name,
                                train_token_layout *out, char *err, size_t err_size) {
    if (size < TRAIN_TOKENS_HEADER)
        return fail(err, err_size,
                    "%s is %lld bytes, shorter than the %d-byte header of a token file: it is "
                    "truncated or not a token file; write it with tools/text_to_tokens.py",
                    name, (long long)size, TRAIN_TOKENS_HEADER);
    uint32_t version = (uint32_t)le(h + 8, 4), bytes = (uint32_t)le(h + 12, 4);
    if (version != TRAIN_TOKENS_VERSION)
        return fail(err, err_size,
                    "%s has format version %u, but this fsdp-train reads version %d; write it "
                    "again with this version's tools/text_to_tokens.py",
                    name, version, TRAIN_TOKENS_VERSION);
    if (bytes != 2 && bytes != 4)
        return fail(err, err_size,
                    "%s says its token ids take %u bytes each, but only 2 (uint16) and 4 "
                    "(uint32) exist: the header is damaged; write the file again",
                    name, bytes);
    *out = (train_token_layout){.format = TRAIN_TOKEN_FORMAT_FSDPTOK,
                                .offset = TRAIN_TOKENS_HEADER,
                                .count = (int64_t)le(h + 16, 8),
                                .bytes = (int)bytes,
                                .vocab = le(h + 24, 8)};
    return check_body(name, "header", le(h + 16, 8), (int)bytes, TRAIN_TOKENS_HEADER, size,
                      "write it again", err, err_size);
}

/* ---- llm.c's .bin shard ------------------------------------------------------------------ */

static fsdp_status read_llmc(const unsigned char *h, int64_t size, const char *name,
                             train_token_layout *out, char *err, size_t err_size) {
    if (size < TRAIN_LLMC_HEADER)
        return fail(err, err_size,
                    "%s starts with llm.c's magic %u but is %lld bytes, shorter than the "
                    "%d-byte header (256 int32) of an llm.c .bin shard: it is truncated; write "
                    "it again with llm.c's dev/data scripts",
                    name, (unsigned)le(h, 4), (long long)size, TRAIN_LLMC_HEADER);
    uint32_t magic = (uint32_t)le(h, 4);
    int32_t version = (int32_t)(uint32_t)le(h + 4, 4), count = (int32_t)(uint32_t)le(h + 8, 4);
    int bytes = magic == TRAIN_LLMC_MAGIC_GPT2 ? 2 : 4;
    if (version != TRAIN_LLMC_VERSION)
        return fail(err, err_size,
                    "%s: the llm.c .bin header's version (header[1]) is %d, but magic %u shards "
                    "have version %d (%s tokens); write it again with llm.c's dev/data scripts",
                    name, version, magic, TRAIN_LLMC_VERSION, bytes == 2 ? "uint16" : "uint32");
    if (count <= 0)
        return fail(err, err_size,
                    "%s: the llm.c .bin header's token count (header[2]) is %d; a shard holds at "
                    "least one token: the header is damaged, write it again",
                    name, count);
    *out = (train_token_layout){.format = TRAIN_TOKEN_FORMAT_LLMC,
                                .offset = TRAIN_LLMC_HEADER,
                                .count = count,
                                .bytes = bytes};
    return check_body(name, "llm.c header (header[2])", (uint64_t)count, bytes, TRAIN_LLMC_HEADER,
                      size, "write it again with llm.c's dev/data scripts", err, err_size);
}

/* ---- NumPy's .npy ------------------------------------------------------------------------ */

typedef struct npy_parse {
    const char *begin, *p, *end;
} npy_parse;

static void skip_space(npy_parse *s) {
    while (s->p < s->end && isspace((unsigned char)*s->p)) s->p++;
}

static bool eat(npy_parse *s, char c) {
    skip_space(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

/* A quoted Python string ('...' or "...") without escapes, into buf. */
static bool quoted(npy_parse *s, char *buf, size_t size) {
    skip_space(s);
    if (s->p >= s->end || (*s->p != '\'' && *s->p != '"')) return false;
    char q = *s->p++;
    size_t n = 0;
    while (s->p < s->end && *s->p != q && *s->p != '\\')
        if (n + 1 < size)
            buf[n++] = *s->p++;
        else
            return false;
    buf[n] = '\0';
    return s->p < s->end && *s->p++ == q;
}

static bool word(npy_parse *s, const char *w) {
    skip_space(s);
    size_t n = strlen(w);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0) return false;
    s->p += n;
    return true;
}

/* (d0, d1, ...): at most 8 dimensions, each a decimal below 2^62. */
static bool shape(npy_parse *s, int64_t *dims, int *ndim) {
    *ndim = 0;
    if (!eat(s, '(')) return false;
    for (;;) {
        if (eat(s, ')')) return true;
        skip_space(s);
        if (s->p >= s->end || !isdigit((unsigned char)*s->p) || *ndim == 8) return false;
        int64_t v = 0;
        while (s->p < s->end && isdigit((unsigned char)*s->p)) {
            if (v > (INT64_C(1) << 62) / 10) return false;
            v = v * 10 + (*s->p++ - '0');
        }
        if (s->p < s->end && *s->p == 'L') s->p++; /* Python 2's long */
        dims[(*ndim)++] = v;
        if (!eat(s, ',')) return eat(s, ')');
    }
}

/* The header dict: descr, fortran_order and shape, each exactly once. */
static fsdp_status npy_dict(npy_parse *s, const char *name, char *descr, size_t descr_size,
                            bool *fortran, int64_t *dims, int *ndim, char *err, size_t err_size) {
    const char *fix = "write it with numpy.save";
    bool seen[3] = {false, false, false};
    if (!eat(s, '{'))
        return fail(err, err_size, "%s: the .npy header is not a dict ('{' missing); %s", name,
                    fix);
    while (!eat(s, '}')) {
        char key[32];
        if (!quoted(s, key, sizeof key) || !eat(s, ':'))
            return fail(err, err_size,
                        "%s: the .npy header dict cannot be read (a key and ':' expected at "
                        "byte %td of the header); %s",
                        name, s->p - s->begin, fix);
        int k = !strcmp(key, "descr")           ? 0
                : !strcmp(key, "fortran_order") ? 1
                : !strcmp(key, "shape")         ? 2
                                                : -1;
        if (k < 0 || seen[k])
            return fail(err, err_size,
                        "%s: the .npy header has %s key '%s' (it holds exactly 'descr', "
                        "'fortran_order' and 'shape'); %s",
                        name, k < 0 ? "an unknown" : "a repeated", key, fix);
        seen[k] = true;
        bool ok = k == 0   ? quoted(s, descr, descr_size)
                  : k == 1 ? (word(s, "True") ? (*fortran = true)
                                              : (word(s, "False") && !(*fortran = false)))
                           : shape(s, dims, ndim);
        if (!ok)
            return fail(err, err_size, "%s: the .npy header's '%s' value cannot be read; %s", name,
                        key, fix);
        if (!eat(s, ',')) {
            if (eat(s, '}')) break;
            return fail(err, err_size,
                        "%s: the .npy header dict cannot be read (',' or '}' expected after "
                        "'%s'); %s",
                        name, key, fix);
        }
    }
    for (int k = 0; k < 3; k++)
        if (!seen[k])
            return fail(err, err_size, "%s: the .npy header has no '%s' key; %s", name,
                        k == 0   ? "descr"
                        : k == 1 ? "fortran_order"
                                 : "shape",
                        fix);
    skip_space(s);
    if (s->p != s->end)
        return fail(err, err_size, "%s: the .npy header has text after its dict; %s", name, fix);
    return FSDP_OK;
}

static fsdp_status read_npy(const unsigned char *h, size_t n, int64_t size, const char *name,
                            train_token_layout *out, char *err, size_t err_size) {
    if (size < 10 || n < 10)
        return fail(err, err_size,
                    "%s is %lld bytes, shorter than the 10-byte start of a .npy file: it is "
                    "truncated; write it again with numpy.save",
                    name, (long long)size);
    int major = h[6], minor = h[7];
    if (major < 1 || major > 3 || minor != 0)
        return fail(err, err_size,
                    "%s is .npy format version %d.%d, but only 1.0, 2.0 and 3.0 exist: the "
                    "header is damaged, or it is a newer format; write it with numpy.save",
                    name, major, minor);
    int64_t start = major == 1 ? 10 : 12;
    int64_t hlen = major == 1 ? (int64_t)le(h + 8, 2) : (int64_t)le(h + 8, 4);
    if (size < start || start + hlen > size || (size_t)(start + hlen) > n)
        return fail(err, err_size,
                    "%s: the .npy header length is %lld bytes, but the file has %lld bytes "
                    "after its %lld-byte start: it is truncated or damaged; write it again with "
                    "numpy.save",
                    name, (long long)hlen, (long long)(size - start), (long long)start);
    npy_parse s = {(const char *)h + start, (const char *)h + start,
                   (const char *)h + start + hlen};
    char descr[16] = "";
    bool fortran = false;
    int64_t dims[8];
    int ndim = 0;
    fsdp_status st = npy_dict(&s, name, descr, sizeof descr, &fortran, dims, &ndim, err, err_size);
    if (st != FSDP_OK) return st;
    static const struct {
        const char *descr;
        int bytes;
        bool is_signed;
    } kinds[] = {{"<u2", 2, false}, {"<i4", 4, true}, {"<u4", 4, false}, {"<i8", 8, true}};
    int kind = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(descr, kinds[i].descr)) kind = i;
    if (kind < 0)
        return fail(err, err_size,
                    "%s: the .npy dtype is '%s', but token ids are read as '<u2' (uint16), "
                    "'<i4' (int32), '<u4' (uint32) or '<i8' (int64), little-endian; save "
                    "arr.astype('<u4') (or '<u2' when the vocabulary fits)",
                    name, descr);
    if (fortran)
        return fail(err, err_size,
                    "%s: the .npy array is in Fortran order (fortran_order True); save a C-order "
                    "1-D array: numpy.save(path, numpy.ascontiguousarray(arr).reshape(-1))",
                    name);
    if (ndim != 1) {
        char dims_text[128] = "";
        for (int i = 0; i < ndim; i++) {
            size_t used = strlen(dims_text);
            snprintf(dims_text + used, sizeof dims_text - used, "%s%lld", i ? ", " : "",
                     (long long)dims[i]);
        }
        return fail(err, err_size,
                    "%s: the .npy array has shape (%s), %d-D, but a token stream is 1-D; save "
                    "arr.reshape(-1)",
                    name, dims_text, ndim);
    }
    *out = (train_token_layout){.format = TRAIN_TOKEN_FORMAT_NPY,
                                .offset = start + hlen,
                                .count = dims[0],
                                .bytes = kinds[kind].bytes,
                                .is_signed = kinds[kind].is_signed};
    return check_body(name, ".npy shape", (uint64_t)dims[0], kinds[kind].bytes, start + hlen, size,
                      "write it again with numpy.save", err, err_size);
}

fsdp_status train_token_layout_read(const unsigned char *head, size_t n, int64_t size,
                                    const char *name, train_token_layout *out, char *err,
                                    size_t err_size) {
    memset(out, 0, sizeof *out);
    if (n >= 8 && memcmp(head, TRAIN_TOKENS_MAGIC, 8) == 0) /* the magic with its NUL */
        return read_fsdptok(head, size, name, out, err, err_size);
    if (n >= TRAIN_NPY_MAGIC_LEN && memcmp(head, TRAIN_NPY_MAGIC, TRAIN_NPY_MAGIC_LEN) == 0)
        return read_npy(head, n, size, name, out, err, err_size);
    if (n >= 4 && (le(head, 4) == TRAIN_LLMC_MAGIC_GPT2 || le(head, 4) == TRAIN_LLMC_MAGIC_LLAMA))
        return read_llmc(head, size, name, out, err, err_size);
    char shown[40] = "";
    for (size_t i = 0; i < 8 && i < n; i++) {
        size_t used = strlen(shown);
        snprintf(shown + used, sizeof shown - used, "%02x%s", head[i],
                 i < 7 && i + 1 < n ? " " : "");
    }
    return fail(err, err_size,
                "%s (%lld bytes) does not start with the magic of a token file (\"%s\\0\"), of "
                "an llm.c .bin shard (int32 %d or %d) or of a .npy array (\"\\x93NUMPY\"); its "
                "first bytes are %s: it is not a token file; write one with "
                "tools/text_to_tokens.py",
                name, (long long)size, TRAIN_TOKENS_MAGIC, TRAIN_LLMC_MAGIC_GPT2,
                TRAIN_LLMC_MAGIC_LLAMA, n ? shown : "none (the file is empty)");
}
