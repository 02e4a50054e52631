/* sim_impl.h: what the files of src/kernels/sim share and nothing outside reads: the address
 * window (memory.c), the table of live allocations that the fault handler reads (fault.c), the
 * streams and events (stream.c), their counts (counts.c), the caching allocator (allocator.c)
 * and the ThreadSanitizer annotations the streams publish their real edges with. */
#ifndef FSDP_KERNELS_SIM_IMPL_H
#define FSDP_KERNELS_SIM_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "kernels/kernels.h"
#include "kernels/sim/sim.h"

#define SIM_MAX_DEVICES 16
#define SIM_STR_(x)     #x
#define SIM_STR(x)      SIM_STR_(x) /* a macro's value as a string literal */
#define SIM_ALIGN       512         /* every block starts on this boundary, as cudaMalloc's do */

/* ---- the address window (memory.c) ----
 * One reservation of 2 x span bytes: the first half holds the device addresses (never
 * readable: a host dereference faults at once), the second the data (the shadow), at the fixed
 * offset `span`. Device d owns [d * capacity, (d + 1) * capacity) of the first half. */

/* FSDP_SIM_DEVICES (default 2, at most SIM_MAX_DEVICES) and FSDP_SIM_MEMORY (default 8 GiB;
 * suffixes K, M, G), read once. */
int sim_device_count(void);
size_t sim_capacity(void);

/* Reserves the window on first use; FSDP_ERR_DEVICE when the system refuses. */
fsdp_status sim_window_ensure(fsdp_ctx *ctx);
/* The device whose addresses hold p (0 <= result < count), or -1 for any other pointer. */
int sim_device_of(const void *p);
/* The shadow address of a device address, for the streams' workers (NULL stays NULL). */
void *sim_shadow(const void *p);
/* Device memory in the first-fit sense of cudaMalloc: size (a multiple of SIM_ALIGN) bytes of
 * device d, or NULL when its capacity is used up. Fresh memory holds a NaN pattern (0xff
 * bytes), as uninitialised GPU memory holds garbage. */
void *sim_device_take(int device, size_t size);
void sim_device_give(int device, void *ptr, size_t size);
/* Frees the bookkeeping of every device's memory at exit (the mapping stays). */
void sim_window_release(void);

/* ---- live allocations (fault.c): what a fault report names ---- */

#define SIM_FRAMES 12
typedef struct sim_alloc_site {
    const void *ptr;
    size_t size;  /* the block's, rounded */
    size_t asked; /* what the caller asked for */
    int device;
    int nframes;
    void *frames[SIM_FRAMES]; /* the call stack that made it */
} sim_alloc_site;

/* Records a block handed out (installing the fault handler on first use); forgets it, with its
 * record to *site. */
void sim_fault_track(const void *ptr, size_t size, size_t asked, int device);
void sim_fault_untrack(const void *ptr, sim_alloc_site *site);
/* Prints where an allocation was made (its call stack) to stderr. */
void sim_fault_print_site(const sim_alloc_site *site);
/* Prints the allocations still live (device memory leaks) to stderr; returns their count. */
int sim_fault_report_live(void);
void sim_fault_release(void);

/* ---- streams and events (stream.c) ---- */

typedef struct sim_stream sim_stream;
typedef struct sim_event sim_event;

/* A new stream of device d (its worker thread starts with it). NULL when out of memory or
 * threads. */
sim_stream *sim_stream_new(int device);
/* Runs what is queued, then joins and frees the stream. */
void sim_stream_free(sim_stream *s);
/* The calling thread's current stream of device d (its default stream, made on first use,
 * unless set otherwise); never NULL. handle: NULL for the default. */
sim_stream *sim_stream_of(int device, void *handle);
void *sim_stream_current_handle(int device);
void sim_stream_set_current_handle(int device, void *handle);
int sim_stream_device(const sim_stream *s);
/* A number that tells s from every stream before and after it (1, 2, ...): a freed stream's
 * address can come back for a new one, its serial never does. */
uint64_t sim_stream_serial(const sim_stream *s);

/* Queues run(arg copy) on s: `size` bytes at arg are copied now (a launch copies its
 * arguments), and run sees the copy when the stream reaches it. Counted as a launch
 * (counts.c); sim_launch_unseen is not: the simulation's own checks, which no GPU runs. */
void sim_launch(sim_stream *s, void (*run)(void *arg), const void *arg, size_t size);
void sim_launch_unseen(sim_stream *s, void (*run)(void *arg), const void *arg, size_t size);
/* Waits until s has run everything queued so far (a host wait, as sim_event_sync). */
void sim_stream_sync(sim_stream *s);

sim_event *sim_event_new(int device);
void sim_event_free(sim_event *e);
void sim_event_record(sim_event *e, sim_stream *s);
void sim_stream_wait_event(sim_stream *s, sim_event *e);
/* Blocks the host until e's latest record has been passed: counted as a host wait of e's
 * device. sim_event_done asks without blocking, and is not. */
void sim_event_sync(sim_event *e);
bool sim_event_done(sim_event *e);

/* Runs and joins every stream still alive (the threads' default streams included), at exit. */
void sim_streams_release(void);

/* ---- launch and host-wait counts (counts.c, sim.h says what counts) ---- */

void sim_count_launch(int device);
void sim_count_host_wait(int device);

/* ---- the caching allocator (allocator.c) ---- */

/* size bytes (> 0) on device d, taken in the order of the calling thread's current stream;
 * FSDP_ERR_OUT_OF_MEMORY with the device's figures when it is full. Not zeroed. */
fsdp_status sim_block_alloc(fsdp_ctx *ctx, int device, size_t size, void **out);
void sim_block_free(int device, void *ptr);
void sim_blocks_release(void);

/* ---- kernel launches (launch.c): the table's wrappers (table.c, table_llama.c) ---- */

/* The device of a kernel's main array, whose current stream runs the kernel; a pointer that
 * is not sim memory ends the process with a message naming the kernel, as a GPU faults. */
int sim_kernel_device(const void *p, const char *kernel);
/* The shadow address the worker uses for p, which must be memory of `device` (or NULL). */
void *sim_kernel_ptr(int device, const void *p);
/* Queues run on the calling thread's current stream of device; _call also waits for it (the
 * entries that hand a value to the host). */
void sim_kernel_launch(int device, void (*run)(void *arg), const void *arg, size_t size);
void sim_kernel_call(int device, void (*run)(void *arg), const void *arg, size_t size);

/* reduce_n (reduce_n.c), semantics in kernels/kernels.h. */
void sim_reduce_n(void *out, const void *const *in, int n, int64_t count, fsdp_dtype dtype,
                  const fsdp_reduce_n_args *args);

/* The Llama entries (table_llama.c), semantics in kernels/kernels.h. */
void sim_embedding_forward(float *out, const int32_t *tokens, const float *weight, int64_t n,
                           int64_t C, int64_t start, int64_t rows);
void sim_embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int64_t n,
                            int64_t C, int64_t start, int64_t rows);
void sim_rope_forward(float *out, const float *inp, const float *cos, const float *sin, int64_t B,
                      int64_t T, int64_t H, int64_t D);
/* table_bf16.c */
void sim_gemm_bf16_round(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb,
                         fsdp_bf16 *C, int64_t ldc);
void sim_swiglu_forward_bf16(fsdp_bf16 *out, const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n);
void sim_rmsnorm_forward_bf16(fsdp_bf16 *out, float *rstd, const float *inp, const float *weight,
                              float eps, int64_t rows, int64_t cols);
void sim_rope_qk_forward_bf16(float *qo, float *ko, const fsdp_bf16 *q, const fsdp_bf16 *k,
                              const float *cos, const float *sin, int64_t B, int64_t T, int64_t NH,
                              int64_t NKV, int64_t D);
void sim_swiglu_backward_bf16(float *dgate, float *dup, const float *dout, const fsdp_bf16 *gate,
                              const fsdp_bf16 *up, int64_t n);
void sim_swiglu_backward_bf16io(fsdp_bf16 *dgate, fsdp_bf16 *dup, const fsdp_bf16 *dout,
                                const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n);
void sim_swiglu_backward_bf16_round(fsdp_bf16 *dgate, fsdp_bf16 *dup, const float *dout,
                                    const fsdp_bf16 *gate, const fsdp_bf16 *up, int64_t n);
void sim_rope_qk_backward_round(fsdp_bf16 *dq, fsdp_bf16 *dk, const float *dqo, const float *dko,
                                const float *cos, const float *sin, int64_t B, int64_t T,
                                int64_t NH, int64_t NKV, int64_t D);
void sim_rope_qk_forward_bf16_round(fsdp_bf16 *qo, fsdp_bf16 *ko, const fsdp_bf16 *q,
                                    const fsdp_bf16 *k, const float *cos, const float *sin,
                                    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
void sim_rope_qk_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk, const fsdp_bf16 *dqo,
                                     const fsdp_bf16 *dko, const float *cos, const float *sin,
                                     int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
void sim_attention_forward_bf16_round(fsdp_bf16 *out, float *lse, float *scratch,
                                      const fsdp_bf16 *q, const fsdp_bf16 *k, const fsdp_bf16 *v,
                                      int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t D);
void sim_attention_backward_bf16_round(fsdp_bf16 *dq, fsdp_bf16 *dk, fsdp_bf16 *dv, float *scratch,
                                       const fsdp_bf16 *dout, const fsdp_bf16 *q,
                                       const fsdp_bf16 *k, const fsdp_bf16 *v, const fsdp_bf16 *out,
                                       const float *lse, int64_t B, int64_t T, int64_t NH,
                                       int64_t NKV, int64_t D);
void sim_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const fsdp_bf16 *A, int64_t lda, const fsdp_bf16 *B, int64_t ldb, float beta,
                   float *C, int64_t ldc);
/* table_sum.c */
void sim_add3(float *out, const float *a, const float *b, const float *c, int64_t n);
void sim_add3_round_bf16(float *out, const float *a, const float *b, const float *c, int64_t n);
void sim_add_bf16(float *out, const float *a, const fsdp_bf16 *b, int64_t n);
void sim_rmsnorm_backward_add(float *dinp, float *dweight, const float *dout, const float *dres,
                              const float *inp, const float *weight, const float *rstd,
                              int64_t rows, int64_t cols);
/* table_multi.c */
void sim_adam_update_multi(const fsdp_adam_tensor *t, int count, const fsdp_adam_step_args *args);
void sim_fill_multi(float *const *out, const int64_t *n, int count, float value);
/* table_epilogue.c */
void sim_gemm_bias_act(float *out, float *pre, const float *inp, const float *weight,
                       const float *bias, int64_t rows, int64_t C, int64_t OC, fsdp_gemm_act act);
void sim_gemm_bf16_bias_act(float *out, float *pre, const fsdp_bf16 *inp, const fsdp_bf16 *weight,
                            const float *bias, int64_t rows, int64_t C, int64_t OC,
                            fsdp_gemm_act act);
void sim_gemm_bgrad(float *dweight, float *dbias, const float *dout, const float *inp, int64_t rows,
                    int64_t C, int64_t OC);
void sim_rope_qk_forward(float *qo, float *ko, const float *q, const float *k, const float *cos,
                         const float *sin, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                         int64_t D);
void sim_rope_qk_backward(float *dq, float *dk, const float *dqo, const float *dko,
                          const float *cos, const float *sin, int64_t B, int64_t T, int64_t NH,
                          int64_t NKV, int64_t D);
void sim_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin,
                       int64_t B, int64_t T, int64_t H, int64_t D);
void sim_attention_forward(float *out, float *lse, float *scratch, const float *q, const float *k,
                           const float *v, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                           int64_t D);
void sim_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                            int64_t D);
void sim_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
void sim_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n);
void sim_cross_entropy_ignore(float *loss, float *dlogits, const float *logits,
                              const int32_t *targets, int32_t ignore_index, int64_t rows,
                              int64_t classes);
void sim_cross_entropy_ignore_bf16(float *loss, void *dlogits, fsdp_dtype dlogits_dtype,
                                   const fsdp_bf16 *logits, const int32_t *targets,
                                   int32_t ignore_index, int64_t rows, int64_t classes);
void sim_vocab_row_max(float *mx, const float *logits, int64_t rows, int64_t V);
void sim_vocab_exp_sums(float *se, float *xt, const float *logits, const float *mx,
                        const int32_t *targets, int32_t ignore_index, int64_t start, int64_t rows,
                        int64_t V);
void sim_vocab_ce_grad(float *dlogits, const float *logits, const float *mx, const float *se,
                       const int32_t *targets, int32_t ignore_index, int64_t start, int64_t rows,
                       int64_t V, int64_t n);

/* ---- ThreadSanitizer ----
 * The queues' own locks would chain every host wait to every stream and hide a missing
 * cross-stream wait, so their synchronisation and bookkeeping are hidden from TSan and only
 * the real edges are published: launch -> work, work -> event -> waiter. */
#if defined(__SANITIZE_THREAD__)
#define SIM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SIM_TSAN 1
#endif
#endif
#ifdef SIM_TSAN
void AnnotateIgnoreSyncBegin(const char *file, int line);
void AnnotateIgnoreSyncEnd(const char *file, int line);
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define SIM_HIDE_BEGIN()                                                                           \
    (AnnotateIgnoreSyncBegin(__FILE__, __LINE__), AnnotateIgnoreReadsBegin(__FILE__, __LINE__),    \
     AnnotateIgnoreWritesBegin(__FILE__, __LINE__))
#define SIM_HIDE_END()                                                                             \
    (AnnotateIgnoreWritesEnd(__FILE__, __LINE__), AnnotateIgnoreReadsEnd(__FILE__, __LINE__),      \
     AnnotateIgnoreSyncEnd(__FILE__, __LINE__))
#define SIM_PUBLISH(addr) __tsan_release(addr)
#define SIM_OBSERVE(addr) __tsan_acquire(addr)
#else
#define SIM_HIDE_BEGIN()  ((void)0)
#define SIM_HIDE_END()    ((void)0)
#define SIM_PUBLISH(addr) ((void)(addr))
#define SIM_OBSERVE(addr) ((void)(addr))
#endif

#endif
