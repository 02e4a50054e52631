/* test_comm_device.c: the local backend's collectives on device tensors (src/comm/local_device.c).
 * Every public collective, with 2 and 4 rank threads, each rank on a simulated GPU of its own
 * (sim:(rank % 2), deferred streams: a stream runs only up to what somebody waits for, so a
 * missing wait reads stale data every time), its result copied back and compared bit for bit
 * with the same collective on CPU tensors (the reductions run in rank order on both); sizes of
 * 1, 7 and others that are not multiples of the world; the non-blocking all_reduce waited for
 * on a stream and on the host; comm-debug counts equal to the CPU's; refusals of mixed device
 * kinds and of a device other than the rank's; a rank that never arrives times out naming it;
 * and the negative control: with the wait for the peers' inputs dropped, the result is wrong. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_device.h" // defines: fsdp_comm_work_wait_stream
#include "comm/local_impl.h"  // defines: fsdp_local_test_skip_input_wait
#include "core/stream.h"      // defines: fsdp_stream_current
#include "fsdp/comm.h"
#include "harness.h"         // defines: fsdp_test_run_world, FSDP_RANK_CHECK, FSDP_TEST_OK
#include "kernels/sim/sim.h" // defines: fsdp_sim_mode_set

/* Each rank's device: two ranks share a sim device in a world of 4. */
static fsdp_device rank_device(int rank) {
    return (fsdp_device){FSDP_DEVICE_SIM, rank % 2};
}

/* ---- the cases ---- */

#include "comm_cases.h" // defines: cases, fill, run_case's call and shapes

/* Every case on CPU tensors, then on this rank's device, with comm-debug counting each pass:
 * the results bit for bit and the counts per collective equal. The rank's context is on its
 * device for both (the CPU pass is the metadata that keeps working beside device tensors). */
static fsdp_status all_cases_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const fsdp_device dev = rank_device(rank);
    FSDP_TRY(fsdp_ctx_set_device(ctx, dev));
    unsigned char *want[N_CASES] = {0};
    size_t want_n[N_CASES] = {0};
    fsdp_comm_count counts[2][FSDP_COMM_OP_COUNT];
    fsdp_status st = FSDP_OK;
    for (int pass = 0; pass < 2 && st == FSDP_OK; pass++) {
        st = fsdp_comm_debug_begin(ctx);
        for (int k = 0; k < N_CASES && st == FSDP_OK; k++) {
            const coll_case *c = &cases[k];
            unsigned char *got = NULL;
            size_t n = 0;
            st = run_case(ctx, rank, W, c, pass ? dev : FSDP_CPU, (uint64_t)k + 1, &got, &n);
            if (st != FSDP_OK) break;
            if (!pass) {
                want[k] = got, want_n[k] = n;
                continue;
            }
            bool same = n == want_n[k] && memcmp(got, want[k], n) == 0;
            size_t first = 0;
            while (!same && first < n && first < want_n[k] && got[first] == want[k][first]) first++;
            free(got);
            FSDP_RANK_CHECK(ctx, same,
                            "case %d (kind %d, %s, %s): the result on %s:%d differs from the "
                            "CPU's (%zu and %zu bytes, first difference at byte %zu)",
                            k, (int)c->kind, fsdp_dtype_to_string(c->dtype),
                            fsdp_reduce_op_to_string(c->op), fsdp_device_to_string(dev), dev.index,
                            n, want_n[k], first);
        }
        for (int op = 0; op < FSDP_COMM_OP_COUNT; op++)
            counts[pass][op] = fsdp_comm_debug_count(ctx, (fsdp_comm_op)op, NULL);
        if (st == FSDP_OK) st = fsdp_comm_debug_end(ctx);
    }
    for (int k = 0; k < N_CASES; k++) free(want[k]);
    FSDP_TRY(st);
    for (int op = 1; op < FSDP_COMM_OP_COUNT; op++) {
        const fsdp_comm_count *a = &counts[0][op], *b = &counts[1][op];
        FSDP_RANK_CHECK(ctx, a->calls == b->calls && a->bytes == b->bytes && a->calls > 0,
                        "comm-debug counts %s: %lld calls, %lld bytes on the CPU; %lld, %lld on "
                        "the device",
                        fsdp_comm_op_to_string((fsdp_comm_op)op), (long long)a->calls,
                        (long long)a->bytes, (long long)b->calls, (long long)b->bytes);
    }
    return FSDP_OK;
}

/* A world of one (as the real NCCL runs on one GPU): every case, the roots reduced to rank 0. */
static void test_one_rank(void) {
    FSDP_TEST_OK(fsdp_test_run_world(1, 60000, all_cases_body, NULL));
}

static void test_two_ranks(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, all_cases_body, NULL));
}

static void test_four_ranks(void) {
    FSDP_TEST_OK(fsdp_test_run_world(4, 60000, all_cases_body, NULL));
}

/* A rank may change its device between calls: each all_reduce on the new devices is right (the
 * events the ranks made on their old devices stay valid for peers still waiting on them). */
static fsdp_status change_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const int64_t n = 7;
    fsdp_status st = FSDP_OK;
    for (int round = 0; round < 3 && st == FSDP_OK; round++) {
        const fsdp_device dev = rank_device(rank + round);
        fsdp_tensor *h = NULL, *d = NULL;
        st = fsdp_ctx_set_device(ctx, dev);
        if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &h);
        if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, h, (float)(rank + round));
        if (st == FSDP_OK) st = on(ctx, h, dev, &d);
        if (st == FSDP_OK) st = fsdp_all_reduce(ctx, NULL, d, SUM);
        if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, h, d);
        const float want = (float)(W * (W - 1) / 2 + W * round);
        for (int64_t i = 0; st == FSDP_OK && i < n; i++)
            if (fsdp_tensor_f32(h)[i] != want)
                st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "round %d: element %lld is %g, want %g",
                               round, (long long)i, (double)fsdp_tensor_f32(h)[i], (double)want);
        fsdp_tensor_free(h), fsdp_tensor_free(d);
    }
    return st;
}

static void test_device_change(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 20000, change_body, NULL));
    FSDP_TEST_OK(fsdp_test_run_world(4, 20000, change_body, NULL));
}

/* ---- started collectives ---- */

/* This rank's newest flight-recorder line, without its call numbers and state: "all_gather on
 * group 'world' (world ranks 0,1) of (4, 5, 3) i32" (out: size bytes). *in_flight: whether the
 * line says the call is in flight. */
static fsdp_status last_call(fsdp_ctx *ctx, char *out, size_t size, bool *in_flight) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    FSDP_RANK_CHECK(ctx, f, "open_memstream failed");
    fsdp_status st = fsdp_comm_trace_print(ctx, 1, f);
    fclose(f);
    const char *call = st == FSDP_OK ? strstr(text, ": ") : NULL; /* after "rank R call N" */
    const char *num = call ? strstr(call, " #") : NULL;           /* the call on the group */
    const char *group = num ? strstr(num, " on group ") : NULL;   /* the rest... */
    const char *state = group ? strstr(group, "f32: ") : NULL;    /* ...up to the state */
    if (group && !state) state = strstr(group, "i32: ");
    if (group && !state) state = strstr(group, "bf16: ");
    if (group && !state) state = strstr(group, "f16: ");
    if (group && !state)
        state = strstr(group, ": "); /* a barrier has no tensor */
    else if (state)
        state = strchr(state, ':');
    if (st == FSDP_OK && !state)
        st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL, "unexpected flight-recorder line: %s", text);
    if (st == FSDP_OK) {
        snprintf(out, size, "%.*s%.*s", (int)(num - call - 2), call + 2, (int)(state - group),
                 group);
        *in_flight = strstr(state, "not waited for yet") != NULL;
    }
    free(text);
    return st;
}

/* What the hook between a start and its wait saw: whether the work was pending and the
 * recorder showed the call in flight. */
static _Thread_local bool seen_pending, seen_in_flight;

static fsdp_status look_in_flight(fsdp_ctx *ctx, const coll_case *c, fsdp_comm_work *work) {
    (void)c;
    char desc[512];
    seen_pending = fsdp_comm_work_pending(work);
    return last_call(ctx, desc, sizeof desc, &seen_in_flight);
}

/* Every started case on CPU tensors and on this rank's device, against the same call made
 * blocking with the same inputs: the result bit for bit, the comm-debug counts of every op and
 * the flight-recorder line (op, group, shape, dtype) equal. On the device the work is pending
 * between its start and its wait (the barrier's, which meets on the host, and every CPU call's
 * is complete at once) and the recorder shows the call in flight until then. */
static fsdp_status starts_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const fsdp_device dev = rank_device(rank);
    FSDP_TRY(fsdp_ctx_set_device(ctx, dev));
    int n_started = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < N_CASES; k++) {
            const coll_case *c = &cases[k];
            if (wait_of(c) == W_BLOCK) continue;
            coll_case twin = *c;
            twin.kind =
                c->kind == K_START_HOST || c->kind == K_START_STREAM ? K_ALL_REDUCE : c->kind;
            twin.wait = W_BLOCK;
            unsigned char *got[2] = {0};
            size_t n[2] = {0};
            fsdp_comm_count counts[2][FSDP_COMM_OP_COUNT];
            char desc[2][512];
            bool flight = false;
            fsdp_status st = FSDP_OK;
            for (int i = 0; i < 2 && st == FSDP_OK; i++) {
                seen_pending = seen_in_flight = false;
                st = fsdp_comm_debug_begin(ctx);
                if (st == FSDP_OK)
                    st = run_case(ctx, rank, W, i ? c : &twin, pass ? dev : FSDP_CPU,
                                  (uint64_t)k + 7, &got[i], &n[i]);
                for (int op = 0; op < FSDP_COMM_OP_COUNT; op++)
                    counts[i][op] = fsdp_comm_debug_count(ctx, (fsdp_comm_op)op, NULL);
                fsdp_status end = fsdp_comm_debug_end(ctx);
                if (st == FSDP_OK) st = end;
                if (st == FSDP_OK) st = last_call(ctx, desc[i], sizeof desc[i], &flight);
            }
            const bool same = st == FSDP_OK && n[0] == n[1] && !memcmp(got[0], got[1], n[0]);
            free(got[0]), free(got[1]);
            FSDP_TRY(st);
            FSDP_RANK_CHECK(ctx, same,
                            "case %d (kind %d, %s) on %s: the start's result is not "
                            "the blocking call's",
                            k, (int)c->kind, fsdp_dtype_to_string(c->dtype),
                            pass ? "the device" : "the CPU");
            for (int op = 0; op < FSDP_COMM_OP_COUNT; op++)
                FSDP_RANK_CHECK(ctx,
                                counts[0][op].calls == counts[1][op].calls &&
                                    counts[0][op].bytes == counts[1][op].bytes,
                                "case %d: comm-debug counts %s %lld calls, %lld bytes blocking; "
                                "%lld, %lld started",
                                k, fsdp_comm_op_to_string((fsdp_comm_op)op),
                                (long long)counts[0][op].calls, (long long)counts[0][op].bytes,
                                (long long)counts[1][op].calls, (long long)counts[1][op].bytes);
            FSDP_RANK_CHECK(ctx, !strcmp(desc[0], desc[1]) && !flight,
                            "case %d: the recorder has \"%s\" blocking and \"%s\" started%s", k,
                            desc[0], desc[1], flight ? " (in flight after its wait)" : "");
            const bool queued = pass == 1 && c->kind != K_BARRIER;
            FSDP_RANK_CHECK(ctx, seen_pending == queued && seen_in_flight == queued,
                            "case %d on %s: between start and wait the work was %spending and "
                            "the recorder showed it %sin flight",
                            k, pass ? "the device" : "the CPU", seen_pending ? "" : "not ",
                            seen_in_flight ? "" : "not ");
            n_started++;
        }
    FSDP_RANK_CHECK(ctx, n_started >= 24, "only %d started cases ran", n_started);
    return FSDP_OK;
}

static void test_starts_as_blocking(void) {
    between_start_and_wait = look_in_flight;
    FSDP_TEST_OK(fsdp_test_run_world(2, 60000, starts_body, NULL));
    FSDP_TEST_OK(fsdp_test_run_world(4, 60000, starts_body, NULL));
    between_start_and_wait = NULL;
}

/* ---- refusals and failures ---- */

static fsdp_status expect_failure(fsdp_ctx *ctx, fsdp_status got, fsdp_status want,
                                  const char *const *needles) {
    const char *msg = fsdp_last_error(ctx);
    FSDP_RANK_CHECK(ctx, got == want, "expected %s, got %s: %s", fsdp_status_to_string(want),
                    fsdp_status_to_string(got), msg);
    FSDP_RANK_CHECK(ctx, fsdp_test_message_has(msg, needles), "the message \"%s\" lacks a part",
                    msg);
    return FSDP_OK;
}

/* Rank 1's tensor on the CPU, rank 0's on its device: every rank fails naming the device
 * kinds; then a tensor on a device other than the rank's is refused by its rank, its peer
 * failing at once naming it; the group still works after both. */
static fsdp_status mixed_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int64_t n = 7;
    fsdp_tensor *t = NULL, *other = NULL;
    FSDP_TRY(fsdp_ctx_set_device(ctx, rank_device(0)));
    fsdp_status st = fsdp_tensor_create(ctx, F32, rank == 0 ? rank_device(0) : FSDP_CPU, 1, &n, &t);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, rank_device(1), 1, &n, &other);
    const char *kinds[] = {"all_reduce", "device kind",         "rank 0 sim",
                           "rank 1 cpu", "fsdp_ctx_set_device", NULL};
    if (st == FSDP_OK)
        st = expect_failure(ctx, fsdp_all_reduce(ctx, NULL, t, SUM), FSDP_ERR_DEVICE, kinds);
    const char *own[] = {"broadcast", "is on sim:1", "this rank's device is sim:0",
                         "fsdp_ctx_set_device", NULL};
    const char *peer[] = {"broadcast", "rank 1 rejected its arguments", "is on sim:1", NULL};
    if (st == FSDP_OK)
        st = expect_failure(ctx, fsdp_broadcast(ctx, NULL, rank == 1 ? other : t, 0),
                            FSDP_ERR_DEVICE, rank == 1 ? own : peer);
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    fsdp_tensor_free(t), fsdp_tensor_free(other);
    return st;
}

static void test_mixed_devices(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 20000, mixed_body, NULL));
}

/* A work in flight (a device all_reduce) is refused by every start (FSDP_ERR_STATE naming the
 * call in flight and the start), on every rank alike, so the group stays usable: the
 * all_reduce then completes with its right result and the work takes the next call. */
static fsdp_status busy_work_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const fsdp_device dev = rank_device(rank);
    const int64_t n = 4, wn = 4 * W;
    FSDP_TRY(fsdp_ctx_set_device(ctx, dev));
    fsdp_tensor *h = NULL, *t = NULL, *u = NULL, *big = NULL;
    fsdp_comm_work *w = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &h);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, h, (float)(rank + 1));
    if (st == FSDP_OK) st = on(ctx, h, dev, &t);
    if (st == FSDP_OK) st = on(ctx, h, dev, &u);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, dev, 1, &wn, &big);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &w);
    if (st == FSDP_OK) st = fsdp_all_reduce_start(ctx, NULL, t, SUM, w);
    FSDP_RANK_CHECK(ctx, st != FSDP_OK || fsdp_comm_work_pending(w),
                    "a device start is not pending");
    const fsdp_reduce_options half = {.post_scale = 0.5f};
    for (int k = 0; k < 7 && st == FSDP_OK; k++) {
        const char *start[] = {"fsdp_all_reduce_start",     "fsdp_all_gather_start",
                               "fsdp_reduce_scatter_start", "fsdp_reduce_scatter_start",
                               "fsdp_broadcast_start",      "fsdp_all_to_all_start",
                               "fsdp_barrier_start"};
        fsdp_status got = k == 0   ? fsdp_all_reduce_start(ctx, NULL, u, SUM, w)
                          : k == 1 ? fsdp_all_gather_start(ctx, NULL, big, u, 0, w)
                          : k == 2 ? fsdp_reduce_scatter_start(ctx, NULL, u, big, 0, SUM, w)
                          : k == 3
                              ? fsdp_reduce_scatter_start_ex(ctx, NULL, u, big, 0, SUM, &half, w)
                          : k == 4 ? fsdp_broadcast_start(ctx, NULL, u, 0, w)
                          : k == 5 ? fsdp_all_to_all_start(ctx, NULL, big, big, 0, 0, w)
                                   : fsdp_barrier_start(ctx, NULL, w);
        const char *says[] = {start[k], "still in flight", "a all_reduce on group",
                              "fsdp_comm_work_wait", NULL};
        st = expect_failure(ctx, got, FSDP_ERR_STATE, says);
        FSDP_RANK_CHECK(ctx, st != FSDP_OK || fsdp_comm_work_pending(w),
                        "a refused start (%s) ended the work in flight", start[k]);
    }
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, h, t);
    const float want = (float)(W * (W + 1) / 2);
    for (int64_t i = 0; st == FSDP_OK && i < n; i++)
        FSDP_RANK_CHECK(ctx, fsdp_tensor_f32(h)[i] == want, "element %lld is %g, want %g",
                        (long long)i, (double)fsdp_tensor_f32(h)[i], (double)want);
    if (st == FSDP_OK) st = fsdp_all_gather_start(ctx, NULL, big, u, 0, w); /* idle again */
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w);
    fsdp_comm_work_free(w);
    fsdp_tensor_free(h), fsdp_tensor_free(t), fsdp_tensor_free(u), fsdp_tensor_free(big);
    return st;
}

static void test_busy_work_refused(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 20000, busy_work_body, NULL));
}

/* Rank 1 is busy past the timeout: rank 0's device all_reduce fails with FSDP_ERR_TIMEOUT naming
 * the collective and the rank, instead of waiting on a device event forever. */
static fsdp_status timeout_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    FSDP_TRY(fsdp_ctx_set_device(ctx, rank_device(rank)));
    if (rank == 1) {
        fsdp_test_sleep_ms(1500);
        return FSDP_OK;
    }
    const int64_t n = 7;
    fsdp_tensor *t = NULL;
    FSDP_TRY(fsdp_tensor_create(ctx, F32, rank_device(rank), 1, &n, &t));
    const char *says[] = {"all_reduce", "timed out", "rank 1", NULL};
    double t0 = fsdp_test_now();
    fsdp_status st =
        expect_failure(ctx, fsdp_all_reduce(ctx, NULL, t, SUM), FSDP_ERR_TIMEOUT, says);
    double waited = fsdp_test_now() - t0;
    fsdp_tensor_free(t);
    FSDP_TRY(st);
    FSDP_RANK_CHECK(ctx, waited < 1.4, "the timeout of 300 ms took %.2f s", waited);
    return FSDP_OK;
}

static void test_absent_rank_times_out(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 300, timeout_body, NULL));
}

/* The rule that protects inputs: right after an all_gather returns, each rank overwrites its
 * input on its stream. Rank 0 reads back (running its streams) while the others wait at a host
 * barrier; their streams read rank 0's input only after. The collective completes only when
 * every reader is done, so rank 0's overwrite waits for them, and every output is the gather
 * of the original inputs. */
static fsdp_status reuse_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const fsdp_device dev = rank_device(rank);
    const int64_t n = 5, wn = n * W;
    FSDP_TRY(fsdp_ctx_set_device(ctx, dev));
    fsdp_tensor *h = NULL, *hout = NULL, *d = NULL, *dout = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &h);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &wn, &hout);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, h, (float)(rank + 1));
    if (st == FSDP_OK) st = on(ctx, h, dev, &d);
    if (st == FSDP_OK) st = on(ctx, hout, dev, &dout);
    if (st == FSDP_OK) st = fsdp_all_gather(ctx, NULL, dout, d, 0);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, d, -1.0f); /* the input, reused at once */
    if (st == FSDP_OK && rank == 0) st = fsdp_tensor_copy(ctx, hout, dout);
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    if (st == FSDP_OK && rank != 0) st = fsdp_tensor_copy(ctx, hout, dout);
    const float *x = st == FSDP_OK ? fsdp_tensor_f32(hout) : NULL;
    for (int64_t i = 0; x && i < wn && st == FSDP_OK; i++)
        if (x[i] != (float)(i / n + 1))
            st = FSDP_FAIL(ctx, FSDP_ERR_INTERNAL,
                           "element %lld of the gather is %g, want %g (an input was overwritten "
                           "before a reader's stream read it)",
                           (long long)i, (double)x[i], (double)(i / n + 1));
    fsdp_tensor_free(h), fsdp_tensor_free(hout), fsdp_tensor_free(d), fsdp_tensor_free(dout);
    return st;
}

static void test_input_reuse(void) {
    FSDP_TEST_OK(fsdp_test_run_world(2, 20000, reuse_body, NULL));
    FSDP_TEST_OK(fsdp_test_run_world(4, 20000, reuse_body, NULL));
}

/* ---- the negative control ---- */

typedef struct control {
    uint64_t salt; /* the inputs' (each run's differ from what reused blocks held before) */
    bool right;    /* out: rank 0's result was the CPU's */
} control;

/* An all_reduce on fresh device tensors whose inputs are queued (deferred) on each rank's
 * stream: rank 0 reads its result back first while rank 1 waits at a host barrier, so rank 1's
 * stream has run only what rank 0's collective made it wait for. */
static fsdp_status control_body(fsdp_ctx *ctx, int rank, void *user) {
    control *ctl = user;
    const fsdp_device dev = rank_device(rank);
    const int64_t n = 37;
    const uint64_t salt = ctl->salt;
    FSDP_TRY(fsdp_ctx_set_device(ctx, dev));
    fsdp_tensor *h = NULL, *want = NULL, *d = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &h);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &want);
    if (st == FSDP_OK) st = fill(want, salt + (uint64_t)rank);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, NULL, want, SUM); /* on the CPU */
    if (st == FSDP_OK) st = fill(h, salt + (uint64_t)rank);
    if (st == FSDP_OK) st = on(ctx, h, dev, &d);
    if (st == FSDP_OK) st = fsdp_all_reduce(ctx, NULL, d, SUM);
    if (st == FSDP_OK && rank == 0) {
        st = fsdp_tensor_copy(ctx, h, d);
        if (st == FSDP_OK) ctl->right = !memcmp(fsdp_tensor_data(h), fsdp_tensor_data(want), 4 * n);
    }
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    if (st == FSDP_OK && rank == 1) st = fsdp_tensor_copy(ctx, h, d);
    fsdp_tensor_free(h), fsdp_tensor_free(want), fsdp_tensor_free(d);
    return st;
}

static void test_negative_control(void) {
#ifdef UNDER_TSAN
    fsdp_test_skip("the dropped wait is a data race, which ThreadSanitizer reports (as it must)");
    return;
#endif
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_mode_get(), FSDP_SIM_DEFERRED);
    for (int i = 0; i < 3; i++) {
        control with = {.salt = 1000u + 2u * (uint64_t)i}, without = {.salt = with.salt + 1u};
        FSDP_TEST_OK(fsdp_test_run_world(2, 20000, control_body, &with));
        fsdp_local_test_skip_input_wait(true);
        fsdp_status st = fsdp_test_run_world(2, 20000, control_body, &without);
        fsdp_local_test_skip_input_wait(false);
        FSDP_TEST_OK(st);
        CU_ASSERT_TRUE(with.right);     /* with every wait: the CPU's bits */
        CU_ASSERT_FALSE(without.right); /* without the peers' READY: stale input, every time */
    }
}

/* The started form's negative control: an all_gather started on fresh device tensors, its
 * output read back without waiting for the work (while every rank is still before its wait: a
 * host barrier follows), holds the output's old values (the call has not run: deferred
 * streams); after the wait, the gather. */
static fsdp_status unwaited_body(fsdp_ctx *ctx, int rank, void *user) {
    (void)user;
    const int W = fsdp_world_size(fsdp_ctx_world(ctx));
    const fsdp_device dev = rank_device(rank);
    const int64_t n = 5, wn = n * W;
    FSDP_TRY(fsdp_ctx_set_device(ctx, dev));
    fsdp_tensor *h = NULL, *hout = NULL, *d = NULL, *dout = NULL;
    fsdp_comm_work *w = NULL;
    fsdp_status st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &n, &h);
    if (st == FSDP_OK) st = fsdp_tensor_create(ctx, F32, FSDP_CPU, 1, &wn, &hout);
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, h, (float)(rank + 1));
    if (st == FSDP_OK) st = fsdp_tensor_fill(ctx, hout, -7.0f);
    if (st == FSDP_OK) st = on(ctx, h, dev, &d);
    if (st == FSDP_OK) st = on(ctx, hout, dev, &dout);
    if (st == FSDP_OK) st = fsdp_comm_work_create(ctx, &w);
    if (st == FSDP_OK) st = fsdp_all_gather_start(ctx, NULL, dout, d, 0, w);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, hout, dout); /* no wait: wrong */
    int stale = 0;
    for (int64_t i = 0; st == FSDP_OK && i < wn; i++) stale += fsdp_tensor_f32(hout)[i] == -7.0f;
    if (st == FSDP_OK) st = fsdp_barrier(ctx, NULL);
    if (st == FSDP_OK) st = fsdp_comm_work_wait(ctx, w);
    if (st == FSDP_OK) st = fsdp_tensor_copy(ctx, hout, dout);
    int right = 0;
    for (int64_t i = 0; st == FSDP_OK && i < wn; i++)
        right += fsdp_tensor_f32(hout)[i] == (float)(i / n + 1);
    fsdp_comm_work_free(w);
    fsdp_tensor_free(h), fsdp_tensor_free(hout), fsdp_tensor_free(d), fsdp_tensor_free(dout);
    FSDP_TRY(st);
    FSDP_RANK_CHECK(ctx, stale == wn, "read without the wait, %d of %lld elements were old", stale,
                    (long long)wn);
    FSDP_RANK_CHECK(ctx, right == wn, "after the wait, %d of %lld elements are the gather's", right,
                    (long long)wn);
    return FSDP_OK;
}

static void test_start_unwaited(void) {
#ifdef UNDER_TSAN
    fsdp_test_skip("reading the output before the wait is the race the rule forbids, which "
                   "ThreadSanitizer reports (as it must)");
    return;
#endif
    CU_ASSERT_EQUAL_FATAL(fsdp_sim_mode_get(), FSDP_SIM_DEFERRED);
    FSDP_TEST_OK(fsdp_test_run_world(2, 20000, unwaited_body, NULL));
    FSDP_TEST_OK(fsdp_test_run_world(4, 20000, unwaited_body, NULL));
}

int main(int argc, char **argv) {
    setenv("FSDP_SIM_DEVICES", "2", 1); /* before the first use reads them */
    setenv("FSDP_SIM_MEMORY", "256M", 1);
    unsetenv("FSDP_SIM_MODE"); /* deferred */
    static const fsdp_test_case tests[] = {
        {"one_rank", test_one_rank},
        {"two_ranks", test_two_ranks},
        {"four_ranks", test_four_ranks},
        {"input_reuse", test_input_reuse},
        {"device_change", test_device_change},
        {"starts_as_blocking", test_starts_as_blocking},
        {"mixed_devices", test_mixed_devices},
        {"busy_work_refused", test_busy_work_refused},
        {"absent_rank_times_out", test_absent_rank_times_out},
        {"negative_control", test_negative_control},
        {"start_unwaited", test_start_unwaited},
    };
    return fsdp_test_run(argc, argv, "comm_device", tests, sizeof tests / sizeof tests[0]);
}
