/* test_ckpt_zstd.c: the checkpoints' zstd filter (HDF5 filter id 32015): a chunked f32 dataset
 * through zstd and Fletcher32 read back bitwise and smaller than raw, the plugin read by
 * h5dump, damaged chunks and frames that lie about their size refused without a crash, and a
 * frame without a content size refused. */
#define _POSIX_C_SOURCE 200809L // popen, pclose

#include <hdf5.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "ckpt/zstd_filter.h" // defines: fsdp_zstd_filter_register, fsdp_zstd_filter_apply
#include "harness.h"
#include "shell.h" // defines: fsdp_test_shell

#define ROWS       64
#define COLS       256
#define CHUNK_ROWS 16          /* chunks of (16, 256) f32: 16 KiB */
#define RAW_N      256         /* the one-chunk datasets of raw frames: (256,) f32 */
#define RAW_BYTES  (RAW_N * 4) /* what cd_values[1] records for them */
#define CKPT_PATH  FSDP_BINARY_DIR "/test_ckpt_zstd.h5"
#define RAW_PATH   FSDP_BINARY_DIR "/test_ckpt_zstd_raw.h5"

/* (ROWS, COLS): few distinct values (compressible), none of them short decimals. */
static void fill(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = (float)((i * 7) % 13) * 0.1f - 0.35f;
}

/* A chunked f32 dataset compressed with the filter at `level`, then Fletcher32 if asked. */
static hid_t create_dataset(hid_t file, const char *name, int rank, const hsize_t *dims,
                            const hsize_t *chunk, unsigned level, int fletcher32) {
    FSDP_TEST_OK(fsdp_zstd_filter_register(fsdp_test_ctx()));
    hid_t space = H5Screate_simple(rank, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, rank, chunk);
    H5Pset_filter(dcpl, FSDP_H5Z_ZSTD, H5Z_FLAG_MANDATORY, 1, &level);
    if (fletcher32) H5Pset_fletcher32(dcpl);
    hid_t d = H5Dcreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    H5Sclose(space);
    return d;
}

/* CKPT_PATH with /w (zstd level 3 + Fletcher32) and /z (zstd level 19 only), both `data`. */
static void write_checkpoint(const float *data) {
    const hsize_t dims[2] = {ROWS, COLS}, chunk[2] = {CHUNK_ROWS, COLS};
    hid_t file = H5Fcreate(CKPT_PATH, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(file >= 0);
    const char *names[2] = {"w", "z"};
    for (int k = 0; k < 2; k++) {
        hid_t d = create_dataset(file, names[k], 2, dims, chunk, k == 0 ? 3 : 19, k == 0);
        CU_ASSERT_FATAL(d >= 0);
        CU_ASSERT(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
        H5Dclose(d);
    }
    H5Fclose(file);
}

/* Reads rows [row0, row0 + rows) of dataset `name` in CKPT_PATH, HDF5's error printing off;
 * returns H5Dread's status. */
static herr_t read_rows(const char *name, hsize_t row0, hsize_t rows, float *out) {
    herr_t st = -1;
    H5E_BEGIN_TRY {
        hid_t file = H5Fopen(CKPT_PATH, H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t d = H5Dopen2(file, name, H5P_DEFAULT), fspace = H5Dget_space(d);
        const hsize_t start[2] = {row0, 0}, count[2] = {rows, COLS};
        hid_t mspace = H5Screate_simple(2, count, NULL);
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL);
        st = H5Dread(d, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, out);
        H5Sclose(mspace);
        H5Sclose(fspace);
        H5Dclose(d);
        H5Fclose(file);
    }
    H5E_END_TRY;
    return st;
}

static void *register_from_thread(void *status) {
    *(fsdp_status *)status = fsdp_zstd_filter_register(NULL);
    return NULL;
}

/* Under CTest HDF5_PLUGIN_PATH names the plugin's folder (tests/CMakeLists.txt), as a user's
 * environment may: HDF5 loads the plugin here, and registering must still install the
 * library's class, which records chunk sizes (check_recorded_cd_values). */
static void test_register_is_idempotent(void) {
    H5E_BEGIN_TRY {
        H5Zfilter_avail(FSDP_H5Z_ZSTD);
    }
    H5E_END_TRY;
    pthread_t threads[4];
    fsdp_status st[4];
    for (int i = 0; i < 4; i++) pthread_create(&threads[i], NULL, register_from_thread, &st[i]);
    for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(st[i], FSDP_OK);
    FSDP_TEST_OK(fsdp_zstd_filter_register(fsdp_test_ctx()));
    unsigned info = 0;
    CU_ASSERT(H5Zfilter_avail(FSDP_H5Z_ZSTD) > 0);
    CU_ASSERT(H5Zget_filter_info(FSDP_H5Z_ZSTD, &info) >= 0);
    CU_ASSERT(info & H5Z_FILTER_CONFIG_ENCODE_ENABLED);
    CU_ASSERT(info & H5Z_FILTER_CONFIG_DECODE_ENABLED);
}

/* The pipeline of /w records {level 3, chunk bytes} and nothing else. */
static void check_recorded_cd_values(void) {
    hid_t file = H5Fopen(CKPT_PATH, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(file, "w", H5P_DEFAULT), dcpl = H5Dget_create_plist(d);
    unsigned flags, cd[4] = {0};
    size_t n = 4;
    CU_ASSERT(H5Pget_filter_by_id2(dcpl, FSDP_H5Z_ZSTD, &flags, &n, cd, 0, NULL, NULL) >= 0);
    CU_ASSERT_EQUAL(n, FSDP_ZSTD_CD_COUNT);
    CU_ASSERT_EQUAL(cd[FSDP_ZSTD_CD_LEVEL], 3);
    CU_ASSERT_EQUAL(cd[FSDP_ZSTD_CD_CHUNK_BYTES], CHUNK_ROWS * COLS * sizeof(float));
    H5Pclose(dcpl);
    H5Dclose(d);
    H5Fclose(file);
}

static void test_roundtrip_bitwise_and_smaller(void) {
    static float data[ROWS * COLS], back[ROWS * COLS];
    fill(data, ROWS * COLS);
    write_checkpoint(data);
    const char *names[2] = {"w", "z"};
    for (int k = 0; k < 2; k++) {
        memset(back, 0, sizeof back);
        CU_ASSERT(read_rows(names[k], 0, ROWS, back) >= 0);
        CU_ASSERT_EQUAL(memcmp(back, data, sizeof data), 0);
        hid_t file = H5Fopen(CKPT_PATH, H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t d = H5Dopen2(file, names[k], H5P_DEFAULT);
        hsize_t stored = H5Dget_storage_size(d);
        printf("\n  /%s: %llu bytes stored for %zu raw", names[k], (unsigned long long)stored,
               sizeof data);
        CU_ASSERT(stored > 0 && stored < sizeof data / 4);
        H5Dclose(d);
        H5Fclose(file);
    }
    check_recorded_cd_values();
}

/* The numbers after "DATA {" in h5dump's output (run with -y, no indices) into out[0, max);
 * returns how many, or -1 when there is no DATA block. */
static int parse_h5dump_data(const char *text, float *out, int max) {
    const char *p = strstr(text, "DATA {");
    if (!p) return -1;
    p += strlen("DATA {");
    int n = 0;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\r' || *p == '\t') p++;
        char *end;
        float v = strtof(p, &end);
        if (end == p) return n;
        if (n < max) out[n] = v;
        n++;
        p = end;
    }
}

static void test_h5dump_reads_through_plugin(void) {
    if (system("command -v h5dump >/dev/null 2>&1") != 0) {
        fsdp_test_skip("h5dump not found (Debian: apt-get install hdf5-tools)");
        return;
    }
    static float data[ROWS * COLS], printed[ROWS * COLS];
    fill(data, ROWS * COLS);
    write_checkpoint(data);
    const char *names[2] = {"w", "z"};
    for (int k = 0; k < 2; k++) {
        char command[1024];
        snprintf(command, sizeof command,
                 "HDF5_PLUGIN_PATH='%s' h5dump -y -w 0 -m %%.9g -d /%s '%s' 2>&1",
                 FSDP_H5ZSTD_PLUGIN_DIR, names[k], CKPT_PATH);
        char *text = NULL;
        int status = fsdp_test_shell(command, &text);
        CU_ASSERT_FATAL(text != NULL);
        int n = parse_h5dump_data(text, printed, ROWS * COLS);
        if (status != 0 || n != ROWS * COLS) printf("\n  %s\n%.2000s", command, text);
        CU_ASSERT_EQUAL(status, 0);
        CU_ASSERT_EQUAL(n, ROWS * COLS);
        if (n == ROWS * COLS) CU_ASSERT_EQUAL(memcmp(printed, data, sizeof data), 0);
        free(text);
    }
}

/* Flips one byte in the middle of chunk `idx` of dataset `name` in the file; *row0 is the
 * chunk's first row. */
static void damage_chunk(const char *name, hsize_t idx, hsize_t *row0) {
    hid_t file = H5Fopen(CKPT_PATH, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(file, name, H5P_DEFAULT), space = H5Dget_space(d);
    hsize_t offset[2], size = 0;
    haddr_t addr = HADDR_UNDEF;
    unsigned mask;
    CU_ASSERT(H5Dget_chunk_info(d, space, idx, offset, &mask, &addr, &size) >= 0);
    H5Sclose(space);
    H5Dclose(d);
    H5Fclose(file);
    CU_ASSERT_FATAL(addr != HADDR_UNDEF && size > 8);
    *row0 = offset[0];
    FILE *f = fopen(CKPT_PATH, "r+b");
    CU_ASSERT_FATAL(f != NULL);
    fseek(f, (long)(addr + size / 2), SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)(addr + size / 2), SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

/* A byte flipped inside a stored chunk: with Fletcher32 (/w) the checksum refuses it, without
 * (/z) zstd's frame checksum does; the other chunks still read back. */
static void test_damaged_chunk_fails_to_read(void) {
    static float data[ROWS * COLS], back[ROWS * COLS];
    fill(data, ROWS * COLS);
    write_checkpoint(data);
    const char *names[2] = {"w", "z"};
    for (int k = 0; k < 2; k++) {
        hsize_t bad = 0;
        damage_chunk(names[k], 1, &bad);
        CU_ASSERT(read_rows(names[k], bad, CHUNK_ROWS, back) < 0);
        hsize_t good = bad == 0 ? CHUNK_ROWS : 0;
        CU_ASSERT(read_rows(names[k], good, CHUNK_ROWS, back) >= 0);
        CU_ASSERT_EQUAL(memcmp(back, data + good * COLS, CHUNK_ROWS * COLS * sizeof(float)), 0);
    }
}

/* Writes `frame` as the one stored chunk of a new (RAW_N,) zstd dataset with H5Dwrite_chunk,
 * then reads the dataset into out; returns H5Dread's status. */
static herr_t read_raw_frame(const void *frame, size_t n, float *out) {
    const hsize_t dims[1] = {RAW_N}, offset[1] = {0};
    hid_t file = H5Fcreate(RAW_PATH, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t d = create_dataset(file, "r", 1, dims, dims, 3, 0);
    CU_ASSERT_FATAL(d >= 0);
    CU_ASSERT(H5Dwrite_chunk(d, H5P_DEFAULT, 0, offset, n, frame) >= 0);
    H5Dclose(d);
    H5Fclose(file);
    herr_t st = -1;
    H5E_BEGIN_TRY {
        file = H5Fopen(RAW_PATH, H5F_ACC_RDONLY, H5P_DEFAULT);
        d = H5Dopen2(file, "r", H5P_DEFAULT);
        st = H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
        H5Dclose(d);
        H5Fclose(file);
    }
    H5E_END_TRY;
    return st;
}

/* The filter run backwards on a copy of frame, as HDF5 runs it on a chunk of a dataset whose
 * cd_values are cd[0, cd_n); returns its result, checking that a refusal left the buffer. */
static size_t filter_reverse(size_t cd_n, const unsigned *cd, const void *frame, size_t n) {
    void *buf = malloc(n), *before = buf;
    memcpy(buf, frame, n);
    size_t buf_size = n;
    size_t got = fsdp_zstd_filter_apply(H5Z_FLAG_REVERSE, cd_n, cd, n, &buf_size, &buf);
    if (got == 0) CU_ASSERT(buf == before && buf_size == n);
    free(buf);
    return got;
}

/* A frame header that claims `content` bytes, then one empty last block: 16 bytes. */
static size_t frame_claiming(uint64_t content, uint8_t out[16]) {
    const uint8_t head[5] = {0x28, 0xb5, 0x2f, 0xfd, 0xe0}; /* magic; 8-byte size, 1 segment */
    memcpy(out, head, 5);
    for (int i = 0; i < 8; i++) out[5 + i] = (uint8_t)(content >> (8 * i));
    out[13] = 0x01; /* last block, raw, 0 bytes */
    out[14] = out[15] = 0;
    return 16;
}

/* A compressed chunk from the filter itself (forward), in a malloc'ed buffer of *n bytes. */
static void *filter_forward(const float *x, size_t bytes, size_t *n) {
    void *buf = malloc(bytes);
    memcpy(buf, x, bytes);
    size_t cap = bytes;
    *n = fsdp_zstd_filter_apply(0, 0, NULL, bytes, &cap, &buf);
    CU_ASSERT_FATAL(*n > 0);
    return buf;
}

static void test_lying_frames_fail_to_read(void) {
    float x[2 * RAW_N], back[RAW_N];
    fill(x, 2 * RAW_N);
    size_t n, n2, n_half;
    uint8_t *good = filter_forward(x, RAW_BYTES, &n);
    uint8_t *twice = filter_forward(x, 2 * RAW_BYTES, &n2);
    uint8_t *half = filter_forward(x, RAW_BYTES / 2, &n_half);
    CU_ASSERT(read_raw_frame(good, n, back) >= 0);
    CU_ASSERT_EQUAL(memcmp(back, x, RAW_BYTES), 0);

    uint8_t *bad = malloc(n + 8), claim[16];
    memcpy(bad, good, n);
    bad[n / 2] ^= 0x5a;
    CU_ASSERT(read_raw_frame(bad, n, back) < 0);      /* damaged body: frame checksum */
    CU_ASSERT(read_raw_frame(good, n - 3, back) < 0); /* truncated */
    memcpy(bad, good, n);
    memcpy(bad + n, "junk", 4);
    CU_ASSERT(read_raw_frame(bad, n + 4, back) < 0); /* bytes after the frame */
    CU_ASSERT(read_raw_frame(twice, n2, back) < 0);  /* twice the chunk */
    CU_ASSERT(read_raw_frame(half, n_half, back) < 0);
    CU_ASSERT(read_raw_frame(claim, frame_claiming((uint64_t)1 << 40, claim), back) < 0);
    CU_ASSERT(read_raw_frame(claim, frame_claiming(RAW_BYTES, claim), back) < 0); /* empty */
    CU_ASSERT(read_raw_frame("not a zstd frame", 16, back) < 0);
    memcpy(bad, good, n);
    memcpy(bad + n, "\x50\x2a\x4d\x18\0\0\0\0", 8);  /* an empty skippable frame */
    CU_ASSERT(read_raw_frame(bad, n + 8, back) < 0); /* one frame per chunk */
    free(bad);
    free(good);
    free(twice);
    free(half);
}

/* tests/fixtures/zstd_hdf5plugin.h5, written by h5py with hdf5plugin.Zstd(clevel=5): its
 * pipeline records the level alone, and it reads back bitwise through our filter. */
static void test_reads_what_hdf5plugin_wrote(void) {
    FSDP_TEST_OK(fsdp_zstd_filter_register(fsdp_test_ctx()));
    float want[16 * 64], got[16 * 64];
    fill(want, 16 * 64);
    memset(got, 0, sizeof got);
    hid_t file = H5Fopen(FSDP_FIXTURE_DIR "/zstd_hdf5plugin.h5", H5F_ACC_RDONLY, H5P_DEFAULT);
    CU_ASSERT_FATAL(file >= 0);
    hid_t d = H5Dopen2(file, "x", H5P_DEFAULT), dcpl = H5Dget_create_plist(d);
    unsigned flags, cd[4] = {0};
    size_t n = 4;
    CU_ASSERT(H5Pget_filter_by_id2(dcpl, FSDP_H5Z_ZSTD, &flags, &n, cd, 0, NULL, NULL) >= 0);
    CU_ASSERT(n == 1 && cd[0] == 5);
    CU_ASSERT(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) >= 0);
    CU_ASSERT_EQUAL(memcmp(got, want, sizeof want), 0);
    H5Pclose(dcpl);
    H5Dclose(d);
    H5Fclose(file);
}

/* Without cd_values[1] (a file from another writer) the limit alone bounds a frame. */
static void test_limit_without_recorded_chunk_size(void) {
    const unsigned level_only[1] = {3};
    uint8_t claim[16];
    size_t n = frame_claiming(FSDP_ZSTD_MAX_CHUNK_BYTES + 1, claim);
    CU_ASSERT_EQUAL(filter_reverse(1, level_only, claim, n), 0);
    n = frame_claiming((uint64_t)1 << 62, claim);
    CU_ASSERT_EQUAL(filter_reverse(1, level_only, claim, n), 0);
    CU_ASSERT_EQUAL(filter_reverse(0, NULL, claim, 4), 0); /* shorter than a header */
    float x[RAW_N];
    fill(x, RAW_N);
    uint8_t *frame = filter_forward(x, RAW_BYTES, &n);
    CU_ASSERT_EQUAL(filter_reverse(1, level_only, frame, n), RAW_BYTES);
    free(frame);
}

/* A chunk over FSDP_ZSTD_MAX_CHUNK_BYTES (2 GiB here; HDF5 allows up to 4) fails the dataset's
 * creation: the filter would refuse to read it back. */
static void test_oversized_chunk_refused(void) {
    FSDP_TEST_OK(fsdp_zstd_filter_register(fsdp_test_ctx()));
    const hsize_t dims[1] = {(hsize_t)1 << 29};
    hid_t file = H5Fcreate(RAW_PATH, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t d = -1;
    H5E_BEGIN_TRY {
        d = create_dataset(file, "big", 1, dims, dims, 3, 0);
    }
    H5E_END_TRY;
    CU_ASSERT(d < 0);
    if (d >= 0) H5Dclose(d);
    H5Fclose(file);
}

/* Every level round-trips, out-of-range ones clamped, negative ones as two's complement. */
static void test_levels_clamped(void) {
    const unsigned levels[] = {0, 1, 19, 22, 1000, (unsigned)-5, (unsigned)-1000000};
    float x[RAW_N];
    fill(x, RAW_N);
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        void *buf = malloc(RAW_BYTES);
        memcpy(buf, x, RAW_BYTES);
        size_t cap = RAW_BYTES;
        size_t n = fsdp_zstd_filter_apply(0, 1, &levels[i], RAW_BYTES, &cap, &buf);
        CU_ASSERT(n > 0 && n <= cap);
        const unsigned cd[2] = {levels[i], RAW_BYTES};
        size_t got = fsdp_zstd_filter_apply(H5Z_FLAG_REVERSE, 2, cd, n, &cap, &buf);
        CU_ASSERT_EQUAL(got, RAW_BYTES);
        if (got == RAW_BYTES) CU_ASSERT_EQUAL(memcmp(buf, x, RAW_BYTES), 0);
        free(buf);
    }
}

/* A frame from the streaming API without a pledged size, in a malloc'ed buffer of *n bytes. */
static void *frame_without_size(const float *x, size_t bytes, size_t *n) {
    ZSTD_CStream *cs = ZSTD_createCStream();
    size_t cap = ZSTD_compressBound(bytes) + 64;
    void *dst = malloc(cap);
    ZSTD_initCStream(cs, 3);
    ZSTD_outBuffer out = {dst, cap, 0};
    ZSTD_inBuffer in = {x, bytes, 0};
    CU_ASSERT(!ZSTD_isError(ZSTD_compressStream(cs, &out, &in)));
    CU_ASSERT_EQUAL(ZSTD_endStream(cs, &out), 0);
    ZSTD_freeCStream(cs);
    *n = out.pos;
    return dst;
}

static void test_unknown_content_size_refused(void) {
    float x[RAW_N], back[RAW_N];
    fill(x, RAW_N);
    size_t n;
    void *frame = frame_without_size(x, RAW_BYTES, &n);
    CU_ASSERT_EQUAL_FATAL(ZSTD_getFrameContentSize(frame, n), ZSTD_CONTENTSIZE_UNKNOWN);
    void *dst = malloc(RAW_BYTES); /* the frame itself is sound */
    CU_ASSERT_EQUAL(ZSTD_decompress(dst, RAW_BYTES, frame, n), RAW_BYTES);
    free(dst);
    const unsigned level_only[1] = {3};
    CU_ASSERT_EQUAL(filter_reverse(1, level_only, frame, n), 0);
    CU_ASSERT(read_raw_frame(frame, n, back) < 0);
    free(frame);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"register_is_idempotent", test_register_is_idempotent},
        {"roundtrip_bitwise_and_smaller", test_roundtrip_bitwise_and_smaller},
        {"h5dump_reads_through_plugin", test_h5dump_reads_through_plugin},
        {"damaged_chunk_fails_to_read", test_damaged_chunk_fails_to_read},
        {"lying_frames_fail_to_read", test_lying_frames_fail_to_read},
        {"reads_what_hdf5plugin_wrote", test_reads_what_hdf5plugin_wrote},
        {"limit_without_recorded_chunk_size", test_limit_without_recorded_chunk_size},
        {"oversized_chunk_refused", test_oversized_chunk_refused},
        {"levels_clamped", test_levels_clamped},
        {"unknown_content_size_refused", test_unknown_content_size_refused},
    };
    return fsdp_test_run(argc, argv, "ckpt_zstd", cases, sizeof cases / sizeof cases[0]);
}
