/* test_api_null.c: the C API's NULL contract (docs/api.md, "NULL arguments"), table-driven:
 * every public function that returns fsdp_status, called with each of its required pointer
 * arguments NULL in turn (the others valid), returns FSDP_ERR_INVALID_ARGUMENT with the message
 * "<function>: <argument> is NULL". The table is checked against the list of functions and
 * pointer parameters that the build reads from the headers of include/fsdp/ (api_functions.h, made
 * by cmake/api_functions.cmake), so a new function fails this suite until it has an entry. Also: a
 * module added under itself or its own descendant is refused. */
#define _POSIX_C_SOURCE 200809L /* tmpfile */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_functions.h" // defines: FSDP_API_STATUS_FUNCTIONS, FSDP_API_STATUS_FUNCTION_COUNT
#include "ckpt_common.h"   // defines: ckpt_test_tmp_root, ckpt_test_remove_tree
#include "harness.h"

/* Valid values for every argument of the table's calls, made on one rank of a world of one. */
typedef struct fx {
    fsdp_ctx *ctx;
    int64_t shape[2], start[2], off[2], len[2], widths[2];
    float buf[512];
    int32_t targets[2];
    int ranks[1], mesh_shape[1], i;
    const char *mesh_names[1];
    uint64_t u64_in[1], u64_out[1];
    int64_t i64;
    fsdp_device_memory mem;
    fsdp_device_properties props;
    double flops;
    float loss;
    fsdp_log_level level;
    fsdp_activation act;
    fsdp_placement pl[1];
    fsdp_init init;
    fsdp_module_ops ops;
    fsdp_sgd_options sgd;
    fsdp_adam_options adam;
    fsdp_lr_schedule sched;
    fsdp_tp_style style;
    fsdp_tp_plan_entry plan[1], llama_plan[FSDP_LLAMA_TP_PLAN_LEN];
    int n_plan;
    fsdp_state_sources src;
    fsdp_ckpt_meta meta;
    fsdp_state_entry entry;
    fsdp_state_region region;
    fsdp_ckpt_tensor ct;
    fsdp_ckpt_piece piece;
    fsdp_comm_record rec;
    fsdp_comm_bucket bucket;
    fsdp_profile prof;
    fsdp_optim_state ostate;
    fsdp_flat_segment seg;
    fsdp_llama_config llama, llama_out;
    int32_t token;
    const float *logits;
    /* the objects */
    fsdp_tensor *t, *t2, *x, *dy;
    fsdp_module *model, *seq, *child, *sh_model, *llama_model;
    fsdp_llama_cache *cache;
    fsdp_param *param;
    fsdp_optimizer *opt;
    fsdp_mesh *mesh;
    fsdp_dtensor *dt;
    fsdp_sharded *sh;
    fsdp_state *st;
    fsdp_ckpt_writer *w;
    fsdp_ckpt *ck;
    fsdp_world *world;
    fsdp_comm_work *work;
    bool flag;
    FILE *file;
    char *dir, *path, export_path[512];
    /* where a call that wrongly succeeded would put what it made (the test then fails) */
    fsdp_ctx *made_ctx;
    fsdp_tensor *made_t;
    const fsdp_tensor *made_ct;
    fsdp_module *made_m;
    fsdp_llama_cache *made_cache;
    fsdp_optimizer *made_opt;
    fsdp_mesh *made_mesh;
    fsdp_group *made_group;
    fsdp_dtensor *made_dt;
    fsdp_sharded *made_sh;
    fsdp_state *made_st;
    fsdp_ckpt_writer *made_w;
    fsdp_ckpt *made_ck;
    fsdp_world *made_world;
    fsdp_comm_work *made_work;
    char *made_path;
} fx;

static fsdp_status rank_noop(fsdp_ctx *ctx, int rank, void *user) {
    (void)ctx, (void)rank, (void)user;
    return FSDP_OK;
}
static fsdp_status visit_noop(fsdp_ctx *ctx, fsdp_module *m, void *user) {
    (void)ctx, (void)m, (void)user;
    return FSDP_OK;
}
static fsdp_status visit_param_noop(fsdp_ctx *ctx, fsdp_param *p, const char *name, void *user) {
    (void)ctx, (void)p, (void)name, (void)user;
    return FSDP_OK;
}
static fsdp_status hook_noop(fsdp_ctx *ctx, fsdp_module *m, fsdp_hook_point point,
                             const fsdp_tensor **io, void *user) {
    (void)ctx, (void)m, (void)point, (void)io, (void)user;
    return FSDP_OK;
}
static fsdp_status forward_noop(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *in,
                                const fsdp_tensor **out) {
    (void)ctx, (void)m;
    *out = in;
    return FSDP_OK;
}
static fsdp_status backward_noop(fsdp_ctx *ctx, fsdp_module *m, const fsdp_tensor *dout,
                                 const fsdp_tensor **din) {
    (void)ctx, (void)m;
    if (din) *din = dout;
    return FSDP_OK;
}

/* ---- the table ----
 * One call per function. Its pointer arguments are written A(k, value): argument k (counted
 * among the pointer arguments named in the entry's list) is NULL in case k and `value`
 * otherwise. CALL entries record the message in the context f->ctx; NOCTX entries belong to
 * functions without a context, which can only return the status. */
#define A(k, value) (null_arg == (k) ? NULL : (value))
#define C           A(0, f->ctx)

#define NULL_TABLE(CALL, NOCTX)                                                                    \
    /* ckpt.h */                                                                                   \
    CALL(fsdp_state_create, "ctx src out", fsdp_state_create(C, A(1, &f->src), A(2, &f->made_st))) \
    CALL(fsdp_state_entry_get, "ctx st out",                                                       \
         fsdp_state_entry_get(C, A(1, f->st), 0, A(2, &f->entry)))                                 \
    CALL(fsdp_state_region_get, "ctx st out",                                                      \
         fsdp_state_region_get(C, A(1, f->st), 0, 0, A(2, &f->region)))                            \
    CALL(fsdp_state_read_region, "ctx st dst",                                                     \
         fsdp_state_read_region(C, A(1, f->st), 0, 0, A(2, f->buf)))                               \
    CALL(fsdp_state_write_region, "ctx st src",                                                    \
         fsdp_state_write_region(C, A(1, f->st), 0, 0, A(2, f->buf)))                              \
    CALL(fsdp_state_load_value, "ctx st name value",                                               \
         fsdp_state_load_value(C, A(1, f->st), A(2, "net1.weight"), A(3, f->t)))                   \
    CALL(fsdp_ckpt_writer_create, "ctx dir out",                                                   \
         fsdp_ckpt_writer_create(C, A(1, f->dir), NULL, A(2, &f->made_w)))                         \
    CALL(fsdp_ckpt_save, "ctx w st meta",                                                          \
         fsdp_ckpt_save(C, A(1, f->w), A(2, f->st), A(3, &f->meta)))                               \
    CALL(fsdp_ckpt_writer_wait, "ctx w", fsdp_ckpt_writer_wait(C, A(1, f->w)))                     \
    CALL(fsdp_ckpt_latest, "ctx dir out", fsdp_ckpt_latest(C, A(1, f->dir), A(2, &f->made_path)))  \
    CALL(fsdp_ckpt_open, "ctx path out", fsdp_ckpt_open(C, A(1, f->path), A(2, &f->made_ck)))      \
    CALL(fsdp_ckpt_extra, "ctx ck name out",                                                       \
         fsdp_ckpt_extra(C, A(1, f->ck), A(2, "x"), A(3, &f->i64)))                                \
    CALL(fsdp_ckpt_tensor_get, "ctx ck out",                                                       \
         fsdp_ckpt_tensor_get(C, A(1, f->ck), 0, A(2, &f->ct)))                                    \
    CALL(fsdp_ckpt_piece_get, "ctx ck out",                                                        \
         fsdp_ckpt_piece_get(C, A(1, f->ck), 0, 0, A(2, &f->piece)))                               \
    CALL(fsdp_ckpt_read, "ctx ck region dst",                                                      \
         fsdp_ckpt_read(C, A(1, f->ck), 0, A(2, &f->region), A(3, f->buf)))                        \
    CALL(fsdp_ckpt_piece_stored_bytes, "ctx ck out",                                               \
         fsdp_ckpt_piece_stored_bytes(C, A(1, f->ck), 0, 0, A(2, &f->i64)))                        \
    CALL(fsdp_ckpt_check_shard, "ctx ck", fsdp_ckpt_check_shard(C, A(1, f->ck), 0))                \
    CALL(fsdp_ckpt_export_h5, "ctx ck path",                                                       \
         fsdp_ckpt_export_h5(C, A(1, f->ck), A(2, f->export_path), NULL))                          \
    CALL(fsdp_ckpt_export_safetensors, "ctx ck path",                                              \
         fsdp_ckpt_export_safetensors(C, A(1, f->ck), A(2, f->export_path), NULL))                 \
    CALL(fsdp_ckpt_export_hf, "ctx ck dir",                                                        \
         fsdp_ckpt_export_hf(C, A(1, f->ck), A(2, f->dir), NULL))                                  \
    CALL(fsdp_llama_config_to_hf_json, "ctx cfg out",                                              \
         fsdp_llama_config_to_hf_json(C, A(1, &f->llama), A(2, &f->made_path)))                    \
    CALL(fsdp_llama_config_from_hf_json, "ctx json out",                                           \
         fsdp_llama_config_from_hf_json(C, A(1, "{}"), A(2, &f->llama_out)))                       \
    CALL(fsdp_ckpt_import, "ctx src_path dir",                                                     \
         fsdp_ckpt_import(C, A(1, f->export_path), A(2, f->dir), NULL))                            \
    CALL(fsdp_ckpt_load, "ctx ck st", fsdp_ckpt_load(C, A(1, f->ck), A(2, f->st), NULL))           \
    /* comm.h (the world's context is optional) */                                                 \
    CALL(fsdp_world_create, "out", fsdp_world_create(f->ctx, NULL, A(0, &f->made_world)))          \
    CALL(fsdp_world_run, "world fn",                                                               \
         fsdp_world_run(f->ctx, A(0, f->world), A(1, rank_noop), NULL))                            \
    CALL(fsdp_group_split, "ctx out", fsdp_group_split(C, NULL, 0, 0, NULL, A(1, &f->made_group))) \
    CALL(fsdp_group_new, "ctx ranks out",                                                          \
         fsdp_group_new(C, NULL, 1, A(1, f->ranks), NULL, A(2, &f->made_group)))                   \
    CALL(fsdp_group_share_shards, "ctx shard full",                                                \
         fsdp_group_share_shards(C, NULL, A(1, f->t), A(2, &f->made_t)))                           \
    CALL(fsdp_all_gather, "ctx out in", fsdp_all_gather(C, NULL, A(1, f->t), A(2, f->t2), 0))      \
    CALL(fsdp_all_gather_u64, "ctx in out",                                                        \
         fsdp_all_gather_u64(C, NULL, A(1, f->u64_in), 1, A(2, f->u64_out)))                       \
    CALL(fsdp_reduce_scatter, "ctx out in",                                                        \
         fsdp_reduce_scatter(C, NULL, A(1, f->t), A(2, f->t2), 0, FSDP_REDUCE_SUM))                \
    CALL(fsdp_reduce_scatter_ex, "ctx out in",                                                     \
         fsdp_reduce_scatter_ex(C, NULL, A(1, f->t), A(2, f->t2), 0, FSDP_REDUCE_SUM, NULL))       \
    CALL(fsdp_all_reduce, "ctx t", fsdp_all_reduce(C, NULL, A(1, f->t), FSDP_REDUCE_SUM))          \
    CALL(fsdp_all_reduce_ex, "ctx t",                                                              \
         fsdp_all_reduce_ex(C, NULL, A(1, f->t), FSDP_REDUCE_SUM, NULL))                           \
    CALL(fsdp_all_reduce_start_ex, "ctx t work",                                                   \
         fsdp_all_reduce_start_ex(C, NULL, A(1, f->t), FSDP_REDUCE_SUM, NULL, A(2, f->work)))      \
    CALL(fsdp_comm_work_create, "ctx out", fsdp_comm_work_create(C, A(1, &f->made_work)))          \
    CALL(fsdp_all_reduce_start, "ctx t work",                                                      \
         fsdp_all_reduce_start(C, NULL, A(1, f->t), FSDP_REDUCE_SUM, A(2, f->work)))               \
    CALL(fsdp_comm_work_wait, "ctx work", fsdp_comm_work_wait(C, A(1, f->work)))                   \
    CALL(fsdp_comm_work_test, "ctx work done",                                                     \
         fsdp_comm_work_test(C, A(1, f->work), A(2, &f->flag)))                                    \
    CALL(fsdp_broadcast, "ctx t", fsdp_broadcast(C, NULL, A(1, f->t), 0))                          \
    CALL(fsdp_all_to_all, "ctx out in", fsdp_all_to_all(C, NULL, A(1, f->t), A(2, f->t2), 0, 0))   \
    CALL(fsdp_barrier, "ctx", fsdp_barrier(C, NULL))                                               \
    CALL(fsdp_all_gather_start, "ctx out in work",                                                 \
         fsdp_all_gather_start(C, NULL, A(1, f->t), A(2, f->t2), 0, A(3, f->work)))                \
    CALL(fsdp_reduce_scatter_start, "ctx out in work",                                             \
         fsdp_reduce_scatter_start(C, NULL, A(1, f->t), A(2, f->t2), 0, FSDP_REDUCE_SUM,           \
                                   A(3, f->work)))                                                 \
    CALL(fsdp_reduce_scatter_start_ex, "ctx out in work",                                          \
         fsdp_reduce_scatter_start_ex(C, NULL, A(1, f->t), A(2, f->t2), 0, FSDP_REDUCE_SUM, NULL,  \
                                      A(3, f->work)))                                              \
    CALL(fsdp_broadcast_start, "ctx t work",                                                       \
         fsdp_broadcast_start(C, NULL, A(1, f->t), 0, A(2, f->work)))                              \
    CALL(fsdp_all_to_all_start, "ctx out in work",                                                 \
         fsdp_all_to_all_start(C, NULL, A(1, f->t), A(2, f->t2), 0, 0, A(3, f->work)))             \
    CALL(fsdp_barrier_start, "ctx work", fsdp_barrier_start(C, NULL, A(1, f->work)))               \
    /* comm_hook.h */                                                                              \
    CALL(fsdp_comm_hook_run, "ctx bucket",                                                         \
         fsdp_comm_hook_run(C, FSDP_COMM_HOOK_DEFAULT, A(1, &f->bucket)))                          \
    CALL(fsdp_mesh_create, "ctx shape names out",                                                  \
         fsdp_mesh_create(C, 1, A(1, f->mesh_shape), A(2, f->mesh_names), A(3, &f->made_mesh)))    \
    CALL(fsdp_mesh_dim, "ctx mesh name out",                                                       \
         fsdp_mesh_dim(C, A(1, f->mesh), A(2, "tp"), A(3, &f->made_mesh)))                         \
    CALL(fsdp_mesh_get_group, "ctx mesh out",                                                      \
         fsdp_mesh_get_group(C, A(1, f->mesh), "tp", A(2, &f->made_group)))                        \
    CALL(fsdp_comm_debug_begin, "ctx", fsdp_comm_debug_begin(C))                                   \
    CALL(fsdp_comm_debug_end, "ctx", fsdp_comm_debug_end(C))                                       \
    CALL(fsdp_comm_debug_record, "ctx out", fsdp_comm_debug_record(C, 0, A(1, &f->rec)))           \
    CALL(fsdp_comm_debug_print, "ctx f", fsdp_comm_debug_print(C, A(1, f->file)))                  \
    CALL(fsdp_comm_debug_write_json, "ctx f", fsdp_comm_debug_write_json(C, A(1, f->file)))        \
    CALL(fsdp_comm_trace_print, "ctx f", fsdp_comm_trace_print(C, 0, A(1, f->file)))               \
    /* profile.h */                                                                                \
    CALL(fsdp_profile_start, "ctx", fsdp_profile_start(C))                                         \
    CALL(fsdp_profile_stop, "ctx", fsdp_profile_stop(C))                                           \
    CALL(fsdp_profile_read, "ctx out", fsdp_profile_read(C, A(1, &f->prof)))                       \
    /* ctx.h, cuda.h */                                                                            \
    NOCTX(fsdp_ctx_create, "out", fsdp_ctx_create(NULL, A(0, &f->made_ctx)))                       \
    NOCTX(fsdp_log_level_parse, "text out", fsdp_log_level_parse(A(0, "info"), A(1, &f->level)))   \
    CALL(fsdp_cuda_set_allow_tf32, "ctx", fsdp_cuda_set_allow_tf32(C, false))                      \
    /* layers.h, models.h */                                                                       \
    CALL(fsdp_linear_create, "ctx out", fsdp_linear_create(C, 2, 2, true, A(1, &f->made_m)))       \
    CALL(fsdp_identity_create, "ctx out", fsdp_identity_create(C, A(1, &f->made_m)))               \
    CALL(fsdp_relu_create, "ctx out", fsdp_relu_create(C, A(1, &f->made_m)))                       \
    CALL(fsdp_sigmoid_create, "ctx out", fsdp_sigmoid_create(C, A(1, &f->made_m)))                 \
    CALL(fsdp_gelu_create, "ctx out", fsdp_gelu_create(C, A(1, &f->made_m)))                       \
    CALL(fsdp_rmsnorm_create, "ctx out", fsdp_rmsnorm_create(C, 4, 1e-6f, A(1, &f->made_m)))       \
    CALL(fsdp_sequential_create, "ctx out", fsdp_sequential_create(C, A(1, &f->made_m)))           \
    CALL(fsdp_sequential_append, "ctx seq child",                                                  \
         fsdp_sequential_append(C, A(1, f->seq), A(2, f->child)))                                  \
    CALL(fsdp_model_mlp_module, "ctx out", fsdp_model_mlp_module(C, A(1, &f->made_m)))             \
    CALL(fsdp_model_mlp_stacked, "ctx out", fsdp_model_mlp_stacked(C, 1, A(1, &f->made_m)))        \
    CALL(fsdp_model_simple_mlp, "ctx out", fsdp_model_simple_mlp(C, A(1, &f->made_m)))             \
    CALL(fsdp_model_simple_model, "ctx out", fsdp_model_simple_model(C, A(1, &f->made_m)))         \
    CALL(fsdp_llama_config_resolve, "ctx cfg out",                                                 \
         fsdp_llama_config_resolve(C, A(1, &f->llama), A(2, &f->llama_out)))                       \
    CALL(fsdp_llama_flops_per_token, "ctx cfg out",                                                \
         fsdp_llama_flops_per_token(C, A(1, &f->llama), 8, A(2, &f->flops)))                       \
    CALL(fsdp_embedding_create, "ctx out", fsdp_embedding_create(C, 4, 2, A(1, &f->made_m)))       \
    CALL(fsdp_llama_attention_create, "ctx cfg out",                                               \
         fsdp_llama_attention_create(C, A(1, &f->llama), A(2, &f->made_m)))                        \
    CALL(fsdp_llama_mlp_create, "ctx out", fsdp_llama_mlp_create(C, 2, 4, A(1, &f->made_m)))       \
    CALL(fsdp_llama_decoder_layer_create, "ctx cfg out",                                           \
         fsdp_llama_decoder_layer_create(C, A(1, &f->llama), A(2, &f->made_m)))                    \
    CALL(fsdp_model_llama, "ctx cfg out", fsdp_model_llama(C, A(1, &f->llama), A(2, &f->made_m)))  \
    CALL(fsdp_model_net, "ctx out", fsdp_model_net(C, 4, A(1, &f->made_m)))                        \
    CALL(fsdp_llama_cache_create, "ctx model out",                                                 \
         fsdp_llama_cache_create(C, A(1, f->llama_model), 0, A(2, &f->made_cache)))                \
    CALL(fsdp_llama_decode, "ctx cache tokens logits",                                             \
         fsdp_llama_decode(C, A(1, f->cache), A(2, f->targets), 1, A(3, &f->logits)))              \
    CALL(fsdp_sample_logits, "ctx logits token",                                                   \
         fsdp_sample_logits(C, A(1, f->buf), 4, NULL, 0, A(2, &f->token)))                         \
    NOCTX(fsdp_activation_parse, "text out", fsdp_activation_parse(A(0, "relu"), A(1, &f->act)))   \
    CALL(fsdp_model_mlp, "ctx widths out",                                                         \
         fsdp_model_mlp(C, 2, A(1, f->widths), FSDP_ACT_RELU, A(2, &f->made_m)))                   \
    /* loss.h */                                                                                   \
    CALL(fsdp_loss_sum, "ctx out loss", fsdp_loss_sum(C, A(1, f->t), A(2, &f->loss), NULL))        \
    CALL(fsdp_loss_mse, "ctx out target loss",                                                     \
         fsdp_loss_mse(C, A(1, f->t), A(2, f->t2), A(3, &f->loss), NULL))                          \
    CALL(fsdp_loss_cross_entropy, "ctx logits targets loss",                                       \
         fsdp_loss_cross_entropy(C, A(1, f->t), A(2, f->targets), A(3, &f->loss), NULL))           \
    CALL(fsdp_loss_cross_entropy_ignore, "ctx logits targets loss",                                \
         fsdp_loss_cross_entropy_ignore(C, A(1, f->t), A(2, f->targets), -100, A(3, &f->loss),     \
                                        NULL))                                                     \
    CALL(fsdp_loss_scale_grad, "ctx dout", fsdp_loss_scale_grad(C, A(1, f->t), 1.0f))              \
    /* module.h */                                                                                 \
    CALL(fsdp_module_create, "ctx ops out",                                                        \
         fsdp_module_create(C, A(1, &f->ops), NULL, A(2, &f->made_m)))                             \
    CALL(fsdp_module_add_child, "ctx m name child",                                                \
         fsdp_module_add_child(C, A(1, f->model), A(2, "extra"), A(3, f->child)))                  \
    CALL(fsdp_module_add_param, "ctx m name shape",                                                \
         fsdp_module_add_param(C, A(1, f->child), A(2, "w"), 2, A(3, f->shape), f->init, NULL))    \
    CALL(fsdp_module_add_buffer, "ctx m name shape",                                               \
         fsdp_module_add_buffer(C, A(1, f->child), A(2, "b"), 2, A(3, f->shape), f->init, NULL))   \
    CALL(fsdp_module_visit, "ctx m fn",                                                            \
         fsdp_module_visit(C, A(1, f->model), A(2, visit_noop), NULL))                             \
    CALL(fsdp_module_visit_params, "ctx m fn",                                                     \
         fsdp_module_visit_params(C, A(1, f->model), A(2, visit_param_noop), NULL))                \
    CALL(fsdp_module_reset_parameters, "ctx m",                                                    \
         fsdp_module_reset_parameters(C, A(1, f->model), 1))                                       \
    CALL(fsdp_module_zero_grad, "ctx m", fsdp_module_zero_grad(C, A(1, f->model)))                 \
    CALL(fsdp_module_to, "ctx m", fsdp_module_to(C, A(1, f->model), FSDP_CPU))                     \
    CALL(fsdp_module_set_autocast, "ctx m",                                                        \
         fsdp_module_set_autocast(C, A(1, f->model), FSDP_DTYPE_F32))                              \
    CALL(fsdp_module_forward, "ctx m in out",                                                      \
         fsdp_module_forward(C, A(1, f->model), A(2, f->x), A(3, &f->made_ct)))                    \
    CALL(fsdp_module_backward, "ctx m dout",                                                       \
         fsdp_module_backward(C, A(1, f->model), A(2, f->dy), NULL))                               \
    CALL(fsdp_module_add_hook, "ctx m fn",                                                         \
         fsdp_module_add_hook(C, A(1, f->model), FSDP_HOOK_PRE_FORWARD, A(2, hook_noop), NULL,     \
                              NULL, NULL))                                                         \
    CALL(fsdp_module_add_observer, "ctx m fn",                                                     \
         fsdp_module_add_observer(C, A(1, f->model), FSDP_HOOK_PRE_FORWARD, A(2, hook_noop), NULL, \
                                  NULL, NULL))                                                     \
    CALL(fsdp_module_remove_hook, "ctx m", fsdp_module_remove_hook(C, A(1, f->model), 12345))      \
    CALL(fsdp_checkpoint_wrap, "ctx m", fsdp_checkpoint_wrap(C, A(1, f->model)))                   \
    CALL(fsdp_module_activation_bytes, "ctx m bytes",                                              \
         fsdp_module_activation_bytes(C, A(1, f->model), A(2, &f->i64)))                           \
    /* optim.h */                                                                                  \
    CALL(fsdp_sgd_create, "ctx m opts out",                                                        \
         fsdp_sgd_create(C, A(1, f->model), A(2, &f->sgd), A(3, &f->made_opt)))                    \
    CALL(fsdp_adam_create, "ctx m opts out",                                                       \
         fsdp_adam_create(C, A(1, f->model), A(2, &f->adam), A(3, &f->made_opt)))                  \
    CALL(fsdp_adamw_create, "ctx m opts out",                                                      \
         fsdp_adamw_create(C, A(1, f->model), A(2, &f->adam), A(3, &f->made_opt)))                 \
    CALL(fsdp_optimizer_step, "ctx opt", fsdp_optimizer_step(C, A(1, f->opt)))                     \
    CALL(fsdp_optimizer_zero_grad, "ctx opt", fsdp_optimizer_zero_grad(C, A(1, f->opt)))           \
    CALL(fsdp_optimizer_param_group, "ctx opt fqn group",                                          \
         fsdp_optimizer_param_group(C, A(1, f->opt), A(2, "net1.weight"), A(3, &f->i)))            \
    CALL(fsdp_clip_grad_norm, "ctx m", fsdp_clip_grad_norm(C, A(1, f->model), 1.0, 2.0, NULL))     \
    CALL(fsdp_optimizer_get_state, "ctx opt out",                                                  \
         fsdp_optimizer_get_state(C, A(1, f->opt), 0, A(2, &f->ostate)))                           \
    CALL(fsdp_lr_schedule_check, "ctx s", fsdp_lr_schedule_check(C, A(1, &f->sched)))              \
    /* replicate.h */                                                                              \
    CALL(fsdp_replicate_apply, "ctx root", fsdp_replicate_apply(C, A(1, f->model), NULL, NULL))    \
    CALL(fsdp_batch_slice, "ctx global out",                                                       \
         fsdp_batch_slice(C, A(1, f->t), 0, NULL, A(2, &f->made_t)))                               \
    /* rng.h */                                                                                    \
    CALL(fsdp_init_block, "ctx t init global_shape block_start",                                   \
         fsdp_init_block(C, A(1, f->t), A(2, &f->init), 1, 2, 2, A(3, f->shape), A(4, f->start)))  \
    CALL(fsdp_init_tensor, "ctx t init", fsdp_init_tensor(C, A(1, f->t), A(2, &f->init), 1, 2))    \
    /* tensor.h */                                                                                 \
    CALL(fsdp_device_synchronize, "ctx", fsdp_device_synchronize(C, FSDP_CPU))                     \
    CALL(fsdp_ctx_set_device, "ctx", fsdp_ctx_set_device(C, FSDP_CPU))                             \
    CALL(fsdp_device_memory_stats, "ctx out",                                                      \
         fsdp_device_memory_stats(C, FSDP_CPU, A(1, &f->mem)))                                     \
    CALL(fsdp_device_get_properties, "ctx out",                                                    \
         fsdp_device_get_properties(C, FSDP_CPU, A(1, &f->props)))                                 \
    CALL(fsdp_device_reset_peak_memory, "ctx", fsdp_device_reset_peak_memory(C, FSDP_CPU))         \
    CALL(fsdp_device_empty_cache, "ctx", fsdp_device_empty_cache(C, FSDP_CPU))                     \
    CALL(fsdp_tensor_create, "ctx shape out",                                                      \
         fsdp_tensor_create(C, FSDP_DTYPE_F32, FSDP_CPU, 2, A(1, f->shape), A(2, &f->made_t)))     \
    CALL(fsdp_tensor_create_uninit, "ctx shape out",                                               \
         fsdp_tensor_create_uninit(C, FSDP_DTYPE_F32, FSDP_CPU, 2, A(1, f->shape),                 \
                                   A(2, &f->made_t)))                                              \
    CALL(fsdp_tensor_create_like, "ctx src out",                                                   \
         fsdp_tensor_create_like(C, A(1, f->t), A(2, &f->made_t)))                                 \
    CALL(fsdp_tensor_from_blob, "ctx data shape out",                                              \
         fsdp_tensor_from_blob(C, A(1, f->buf), FSDP_DTYPE_F32, FSDP_CPU, 2, A(2, f->shape),       \
                               A(3, &f->made_t)))                                                  \
    CALL(fsdp_tensor_view, "ctx base shape out",                                                   \
         fsdp_tensor_view(C, A(1, f->t), 0, 2, A(2, f->shape), A(3, &f->made_t)))                  \
    CALL(fsdp_tensor_resize, "ctx t shape", fsdp_tensor_resize(C, A(1, f->t), 2, A(2, f->shape)))  \
    CALL(fsdp_tensor_copy, "ctx dst src", fsdp_tensor_copy(C, A(1, f->t), A(2, f->t2)))            \
    CALL(fsdp_tensor_fill, "ctx t", fsdp_tensor_fill(C, A(1, f->t), 0.0f))                         \
    /* tp.h */                                                                                     \
    CALL(fsdp_placement_local_block, "ctx mesh placements shape offset length",                    \
         fsdp_placement_local_block(C, A(1, f->mesh), A(2, f->pl), 2, A(3, f->shape),              \
                                    A(4, f->off), A(5, f->len)))                                   \
    CALL(fsdp_dtensor_from_local, "ctx local mesh placements out",                                 \
         fsdp_dtensor_from_local(C, A(1, f->t), A(2, f->mesh), A(3, f->pl), NULL,                  \
                                 A(4, &f->made_dt)))                                               \
    CALL(fsdp_distribute_tensor, "ctx global mesh placements out",                                 \
         fsdp_distribute_tensor(C, A(1, f->t), A(2, f->mesh), A(3, f->pl), 0, A(4, &f->made_dt)))  \
    CALL(fsdp_dtensor_redistribute, "ctx dt placements out",                                       \
         fsdp_dtensor_redistribute(C, A(1, f->dt), A(2, f->pl), A(3, &f->made_dt)))                \
    CALL(fsdp_dtensor_redistribute_backward, "ctx grad from out",                                  \
         fsdp_dtensor_redistribute_backward(C, A(1, f->dt), A(2, f->pl), A(3, &f->made_dt)))       \
    CALL(fsdp_dtensor_full_tensor, "ctx dt out",                                                   \
         fsdp_dtensor_full_tensor(C, A(1, f->dt), A(2, &f->made_t)))                               \
    CALL(fsdp_tp_apply, "ctx m mesh style",                                                        \
         fsdp_tp_apply(C, A(1, f->model), A(2, f->mesh), A(3, &f->style), NULL))                   \
    CALL(fsdp_tp_parallelize, "ctx root mesh plan",                                                \
         fsdp_tp_parallelize(C, A(1, f->model), A(2, f->mesh), 1, A(3, f->plan), NULL))            \
    CALL(fsdp_llama_tp_plan, "ctx cfg plan n",                                                     \
         fsdp_llama_tp_plan(C, A(1, &f->llama), 1, true, A(2, f->llama_plan), A(3, &f->n_plan)))   \
    CALL(fsdp_loss_parallel_cross_entropy, "ctx logits targets loss",                              \
         fsdp_loss_parallel_cross_entropy(C, A(1, f->t), A(2, f->targets), -100, A(3, &f->loss),   \
                                          NULL))                                                   \
    CALL(fsdp_param_full_tensor, "ctx p out",                                                      \
         fsdp_param_full_tensor(C, A(1, f->param), false, A(2, &f->made_t)))                       \
    /* wrap.h */                                                                                   \
    CALL(fsdp_fully_shard, "ctx root out",                                                         \
         fsdp_fully_shard(C, A(1, f->model), NULL, A(2, &f->made_sh)))                             \
    CALL(fsdp_sharded_segment, "ctx sh out",                                                       \
         fsdp_sharded_segment(C, A(1, f->sh), 0, A(2, &f->seg)))                                   \
    CALL(fsdp_summon_full_params, "ctx sh", fsdp_summon_full_params(C, A(1, f->sh), NULL))         \
    CALL(fsdp_release_full_params, "ctx sh", fsdp_release_full_params(C, A(1, f->sh)))             \
    CALL(fsdp_sharded_clip_grad_norm, "ctx sh",                                                    \
         fsdp_sharded_clip_grad_norm(C, A(1, f->sh), 1.0, 2.0, NULL))

/* Pointer parameters that may be NULL, each with what NULL means there (the header says so). */
static const struct {
    const char *function, *param, *meaning;
} optional_params[] = {
    {"fsdp_all_gather", "group", "the world group"},
    {"fsdp_all_gather_u64", "group", "the world group"},
    {"fsdp_all_reduce", "group", "the world group"},
    {"fsdp_all_reduce_start", "group", "the world group"},
    {"fsdp_all_reduce_ex", "group", "the world group"},
    {"fsdp_all_reduce_ex", "opts", "a plain all_reduce"},
    {"fsdp_all_reduce_start_ex", "group", "the world group"},
    {"fsdp_all_reduce_start_ex", "opts", "a plain all_reduce"},
    {"fsdp_all_gather_start", "group", "the world group"},
    {"fsdp_all_to_all", "group", "the world group"},
    {"fsdp_all_to_all_start", "group", "the world group"},
    {"fsdp_barrier", "group", "the world group"},
    {"fsdp_barrier_start", "group", "the world group"},
    {"fsdp_broadcast_start", "group", "the world group"},
    {"fsdp_reduce_scatter_start", "group", "the world group"},
    {"fsdp_reduce_scatter_start_ex", "group", "the world group"},
    {"fsdp_reduce_scatter_start_ex", "opts", "a plain reduce_scatter"},
    {"fsdp_batch_slice", "group", "the world group"},
    {"fsdp_broadcast", "group", "the world group"},
    {"fsdp_reduce_scatter", "group", "the world group"},
    {"fsdp_reduce_scatter_ex", "group", "the world group"},
    {"fsdp_reduce_scatter_ex", "opts", "a plain reduce_scatter"},
    {"fsdp_group_new", "parent", "the world group"},
    {"fsdp_group_new", "label", "\"group\""},
    {"fsdp_group_split", "parent", "the world group"},
    {"fsdp_group_share_shards", "group", "the world group"},
    {"fsdp_group_split", "label", "\"group\""},
    {"fsdp_mesh_get_group", "name", "the only dim of a 1-d mesh"},
    {"fsdp_ckpt_export_h5", "opts", "the defaults"},
    {"fsdp_ckpt_export_safetensors", "opts", "the defaults"},
    {"fsdp_ckpt_export_hf", "opts", "the defaults"},
    {"fsdp_ckpt_import", "opts", "the defaults"},
    {"fsdp_ckpt_load", "opts", "strict"},
    {"fsdp_sample_logits", "opts", "greedy"},
    {"fsdp_ckpt_writer_create", "opts", "the defaults"},
    {"fsdp_ctx_create", "opts", "the defaults"},
    {"fsdp_fully_shard", "opts", "the defaults"},
    {"fsdp_replicate_apply", "opts", "the defaults"},
    {"fsdp_replicate_apply", "out", "no handle wanted"},
    {"fsdp_summon_full_params", "opts", "PyTorch's defaults"},
    {"fsdp_tp_apply", "opts", "the defaults"},
    {"fsdp_tp_parallelize", "opts", "the defaults"},
    {"fsdp_world_create", "opts", "the defaults"},
    {"fsdp_world_create", "ctx", "no message wanted"},
    {"fsdp_world_run", "ctx", "no message wanted"},
    {"fsdp_world_run", "user", "passed to fn as it is"},
    {"fsdp_ctx_set_error", "ctx", "nothing recorded"},
    {"fsdp_ctx_set_error", "fmt", "clear the failure"},
    {"fsdp_last_status", "ctx", "FSDP_OK"},
    {"fsdp_world_rank_status", "world",
     "FSDP_ERR_INVALID_ARGUMENT (a rank's result, not "
     "the call's)"},
    {"fsdp_clip_grad_norm", "total_norm", "norm not wanted"},
    {"fsdp_sharded_clip_grad_norm", "total_norm", "norm not wanted"},
    {"fsdp_dtensor_from_local", "global_shape", "even shards"},
    {"fsdp_loss_sum", "dout", "no gradient"},
    {"fsdp_loss_mse", "dout", "no gradient"},
    {"fsdp_loss_cross_entropy", "dlogits", "no gradient"},
    {"fsdp_loss_cross_entropy_ignore", "dlogits", "no gradient"},
    {"fsdp_loss_parallel_cross_entropy", "dlogits", "no gradient"},
    {"fsdp_module_add_param", "out", "no handle wanted"},
    {"fsdp_module_add_buffer", "out", "no handle wanted"},
    {"fsdp_module_add_hook", "user", "passed to fn as it is"},
    {"fsdp_module_add_hook", "free_user", "user is not released"},
    {"fsdp_module_add_hook", "id", "no id wanted"},
    {"fsdp_module_add_observer", "user", "passed to fn as it is"},
    {"fsdp_module_add_observer", "free_user", "user is not released"},
    {"fsdp_module_add_observer", "id", "no id wanted"},
    {"fsdp_module_backward", "din", "the input gradient is not computed"},
    {"fsdp_module_create", "impl", "a kind without state"},
    {"fsdp_module_visit", "user", "passed to fn as it is"},
    {"fsdp_module_visit_params", "user", "passed to fn as it is"},
};
#define N_OPTIONAL ((int)(sizeof optional_params / sizeof optional_params[0]))

/* One function of the table: its name, its required pointer arguments in A() order, whether it
 * has a context for the message, and the call with argument null_arg NULL. */
typedef struct null_entry {
    const char *function, *args;
    bool has_ctx;
    fsdp_status (*call)(fx *f, int null_arg);
} null_entry;

#define DEFINE_CALL(fn, args, expr)                                                                \
    static fsdp_status call_##fn(fx *f, int null_arg) {                                            \
        return expr;                                                                               \
    }
NULL_TABLE(DEFINE_CALL, DEFINE_CALL)
#define ENTRY_CTX(fn, args, expr)   {#fn, args, true, call_##fn},
#define ENTRY_NOCTX(fn, args, expr) {#fn, args, false, call_##fn},
static const null_entry null_table[] = {NULL_TABLE(ENTRY_CTX, ENTRY_NOCTX)};
#define N_ENTRIES ((int)(sizeof null_table / sizeof null_table[0]))

/* The functions and pointer parameters of the headers (generated at build time). */
#define HEADER_ENTRY(fn, params) {#fn, params},
static const struct {
    const char *function, *params;
} header_functions[] = {FSDP_API_STATUS_FUNCTIONS(HEADER_ENTRY)};
_Static_assert(sizeof header_functions / sizeof header_functions[0] ==
                   FSDP_API_STATUS_FUNCTION_COUNT,
               "api_functions.h lists each function once");

/* Whether the space-separated list has the word. */
static bool has_word(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *s = list; (s = strstr(s, word)) != NULL; s += n)
        if ((s == list || s[-1] == ' ') && (s[n] == ' ' || s[n] == '\0')) return true;
    return false;
}

/* The k-th word (0-based) of a space-separated list, into buf. */
static const char *word_at(const char *list, int k, char *buf, size_t size) {
    const char *s = list;
    for (int i = 0; i < k && s; i++) {
        s = strchr(s, ' ');
        if (s) s++;
    }
    size_t n = s ? strcspn(s, " ") : 0;
    if (n >= size) n = size - 1;
    memcpy(buf, s ? s : "", n);
    buf[n] = '\0';
    return buf;
}

static int count_words(const char *list) {
    int n = 0;
    for (const char *s = list; *s; s++)
        if (*s != ' ' && (s == list || s[-1] == ' ')) n++;
    return n;
}

static const null_entry *find_entry(const char *function) {
    for (int i = 0; i < N_ENTRIES; i++)
        if (strcmp(null_table[i].function, function) == 0) return &null_table[i];
    return NULL;
}

static bool is_optional(const char *function, const char *param) {
    for (int i = 0; i < N_OPTIONAL; i++)
        if (!strcmp(optional_params[i].function, function) &&
            !strcmp(optional_params[i].param, param))
            return true;
    return false;
}

/* Every function the headers declare has an entry, and every pointer parameter of it is in
 * the entry's list or among the optional ones; and the table names nothing the headers lack. */
static void test_table_covers_headers(void) {
    int missing = 0, covered_args = 0;
    for (int i = 0; i < FSDP_API_STATUS_FUNCTION_COUNT; i++) {
        const char *fn = header_functions[i].function, *params = header_functions[i].params;
        const null_entry *e = find_entry(fn);
        char p[64];
        for (int k = 0; k < count_words(params); k++) {
            word_at(params, k, p, sizeof p);
            if (e && has_word(e->args, p)) {
                covered_args++;
            } else if (!is_optional(fn, p)) {
                fprintf(stderr,
                        "\n  %s: pointer parameter '%s' has no NULL case in "
                        "tests/test_api_null.c (nor is it listed as optional)",
                        fn, p);
                missing++;
            }
        }
        if (!e && count_words(params) > 0 && !is_optional(fn, word_at(params, 0, p, sizeof p))) {
            fprintf(stderr, "\n  %s has no entry in the NULL table", fn);
            missing++;
        }
    }
    for (int i = 0; i < N_ENTRIES; i++) {
        bool known = false;
        for (int h = 0; h < FSDP_API_STATUS_FUNCTION_COUNT && !known; h++)
            known = !strcmp(header_functions[h].function, null_table[i].function);
        if (!known)
            fprintf(stderr, "\n  table entry %s is not in the headers", null_table[i].function);
        CU_ASSERT_TRUE(known);
        char a[64];
        for (int k = 0; k < count_words(null_table[i].args); k++) {
            bool declared = false;
            for (int h = 0; h < FSDP_API_STATUS_FUNCTION_COUNT && !declared; h++)
                declared = !strcmp(header_functions[h].function, null_table[i].function) &&
                           has_word(header_functions[h].params,
                                    word_at(null_table[i].args, k, a, sizeof a));
            if (!declared)
                fprintf(stderr, "\n  %s has no pointer parameter '%s'", null_table[i].function, a);
            CU_ASSERT_TRUE(declared);
        }
    }
    CU_ASSERT_EQUAL(missing, 0);
    /* The functions with a required pointer and the three whose pointers are all optional. */
    CU_ASSERT_EQUAL(N_ENTRIES + 3, FSDP_API_STATUS_FUNCTION_COUNT);
    printf("\n  %d public status functions, %d in the NULL table, %d required pointer arguments "
           "checked, %d optional\n",
           FSDP_API_STATUS_FUNCTION_COUNT, N_ENTRIES, covered_args, N_OPTIONAL);
}

/* ---- the fixture ---- */

static fsdp_status fx_setup(fsdp_ctx *ctx, fx *f) {
    f->ctx = ctx;
    f->shape[0] = 2, f->shape[1] = 3;
    f->widths[0] = 4, f->widths[1] = 2;
    f->llama = (fsdp_llama_config){.dim = 4, .n_layers = 1, .n_heads = 2, .vocab_size = 8};
    f->ranks[0] = 0, f->mesh_shape[0] = 1;
    f->mesh_names[0] = "tp";
    f->pl[0] = FSDP_REPLICATE;
    f->targets[0] = f->targets[1] = 0;
    f->init = (fsdp_init){.kind = FSDP_INIT_ZEROS};
    f->ops = (fsdp_module_ops){.kind = "Noop", .forward = forward_noop, .backward = backward_noop};
    f->sgd = (fsdp_sgd_options){.lr = 0.1};
    f->adam = (fsdp_adam_options){.lr = 1e-3};
    f->sched = (fsdp_lr_schedule){.kind = FSDP_LR_CONSTANT, .base_lr = 0.1};
    f->style = FSDP_COLWISE();
    f->plan[0] = (fsdp_tp_plan_entry){.key = "net1", .style = FSDP_COLWISE()};
    f->meta = (fsdp_ckpt_meta){.step = 1};
    f->file = tmpfile();
    FSDP_RANK_CHECK(ctx, f->file, "tmpfile failed");
    const int64_t x_shape[2] = {2, 10};
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, f->shape, &f->t));
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, f->shape, &f->t2));
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, x_shape, &f->x));
    FSDP_TRY(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, x_shape, &f->dy));
    FSDP_TRY(fsdp_model_mlp_module(ctx, &f->model));
    FSDP_TRY(fsdp_model_mlp_module(ctx, &f->sh_model));
    FSDP_TRY(fsdp_model_llama(ctx, &f->llama, &f->llama_model));
    FSDP_TRY(fsdp_llama_cache_create(ctx, f->llama_model, 0, &f->cache));
    FSDP_TRY(fsdp_sequential_create(ctx, &f->seq));
    FSDP_TRY(fsdp_identity_create(ctx, &f->child));
    f->param = fsdp_module_get_param(f->model, "net1.weight");
    FSDP_RANK_CHECK(ctx, f->param, "no net1.weight");
    FSDP_TRY(fsdp_sgd_create(ctx, f->model, &f->sgd, &f->opt));
    FSDP_TRY(fsdp_mesh_create(ctx, 1, f->mesh_shape, f->mesh_names, &f->mesh));
    FSDP_TRY(fsdp_dtensor_from_local(ctx, f->t, f->mesh, f->pl, NULL, &f->dt));
    FSDP_TRY(fsdp_fully_shard(ctx, f->sh_model, NULL, &f->sh));
    f->src = (fsdp_state_sources){.model = f->model, .optimizer = f->opt};
    FSDP_TRY(fsdp_state_create(ctx, &f->src, &f->st));
    FSDP_TRY(fsdp_state_region_get(ctx, f->st, 0, 0, &f->region));
    f->dir = ckpt_test_tmp_root();
    FSDP_RANK_CHECK(ctx, f->dir, "no scratch directory");
    snprintf(f->export_path, sizeof f->export_path, "%s/export.h5", f->dir);
    FSDP_TRY(fsdp_ckpt_writer_create(ctx, f->dir, NULL, &f->w));
    FSDP_TRY(fsdp_ckpt_save(ctx, f->w, f->st, &f->meta));
    FSDP_TRY(fsdp_ckpt_latest(ctx, f->dir, &f->path));
    FSDP_TRY(fsdp_ckpt_open(ctx, f->path, &f->ck));
    FSDP_TRY(fsdp_comm_work_create(ctx, &f->work));
    return fsdp_world_create(ctx, NULL, &f->world);
}

static void fx_teardown(fx *f) {
    fsdp_world_free(f->world);
    fsdp_comm_work_free(f->work);
    fsdp_comm_work_free(f->made_work);
    fsdp_ckpt_close(f->ck);
    free(f->path);
    fsdp_ckpt_writer_free(f->ctx, f->w);
    if (f->dir) ckpt_test_remove_tree(f->dir);
    free(f->dir);
    fsdp_state_free(f->st);
    fsdp_sharded_free(f->sh);
    fsdp_dtensor_free(f->dt);
    fsdp_mesh_free(f->mesh);
    fsdp_optimizer_free(f->opt);
    fsdp_module_free(f->child);
    fsdp_module_free(f->seq);
    fsdp_module_free(f->sh_model);
    fsdp_module_free(f->model);
    fsdp_llama_cache_free(f->cache);
    fsdp_llama_cache_free(f->made_cache);
    fsdp_module_free(f->llama_model);
    fsdp_tensor_free(f->dy);
    fsdp_tensor_free(f->x);
    fsdp_tensor_free(f->t2);
    fsdp_tensor_free(f->t);
    if (f->file) fclose(f->file);
}

/* Every entry, every argument: status FSDP_ERR_INVALID_ARGUMENT and, with a context, the
 * message "<function>: <argument> is NULL". */
static fsdp_status run_table(fsdp_ctx *ctx, int rank, void *user) {
    (void)rank;
    int *failures = user;
    fx f = {0};
    fsdp_status st = fx_setup(ctx, &f);
    if (st != FSDP_OK) {
        fprintf(stderr, "\n  fixture: %s: %s", fsdp_status_to_string(st), fsdp_last_error(ctx));
        fx_teardown(&f);
        return st;
    }
    int cases = 0;
    for (int i = 0; i < N_ENTRIES; i++) {
        const null_entry *e = &null_table[i];
        char arg[64], want[160];
        for (int k = 0; k < count_words(e->args); k++) {
            word_at(e->args, k, arg, sizeof arg);
            fsdp_clear_error(ctx);
            fsdp_status got = e->call(&f, k);
            snprintf(want, sizeof want, "%s: %s is NULL", e->function, arg);
            bool message = !e->has_ctx || !strcmp(arg, "ctx") ||
                           strncmp(fsdp_last_error(ctx), want, strlen(want)) == 0;
            if (got != FSDP_ERR_INVALID_ARGUMENT || !message) {
                fprintf(stderr, "\n  %s with %s NULL: %s, message \"%s\" (want \"%s ...\")",
                        e->function, arg, fsdp_status_to_string(got), fsdp_last_error(ctx), want);
                (*failures)++;
            }
            cases++;
        }
    }
    printf("\n  %d NULL cases\n", cases);
    fsdp_clear_error(ctx);
    fx_teardown(&f);
    return FSDP_OK;
}

static void test_null_arguments(void) {
    int failures = 0;
    FSDP_TEST_OK(fsdp_test_run_world(1, 0, run_table, &failures));
    CU_ASSERT_EQUAL(failures, 0);
}

/* The functions whose pointers are all optional keep their documented answers. */
static void test_optional_only(void) {
    CU_ASSERT_EQUAL(fsdp_last_status(NULL), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_world_rank_status(NULL, 0), FSDP_ERR_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(fsdp_ctx_set_error(NULL, FSDP_ERR_IO, NULL), FSDP_ERR_IO);
}

/* A refusal for a NULL argument changes nothing: add_child keeps no hold on the child (the
 * caller still owns it; ASan would see a double free otherwise), and the tree is unchanged. */
static void test_refusal_takes_nothing(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *root, *child;
    FSDP_TEST_OK(fsdp_sequential_create(ctx, &root));
    FSDP_TEST_OK(fsdp_identity_create(ctx, &child));
    FSDP_TEST_FAILS(fsdp_module_add_child(ctx, root, NULL, child), FSDP_ERR_INVALID_ARGUMENT,
                    "fsdp_module_add_child: name is NULL");
    FSDP_TEST_FAILS(fsdp_sequential_append(ctx, NULL, child), FSDP_ERR_INVALID_ARGUMENT,
                    "fsdp_sequential_append: seq is NULL");
    CU_ASSERT_EQUAL(fsdp_module_add_child(NULL, root, "x", child), FSDP_ERR_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(fsdp_module_num_children(root), 0);
    CU_ASSERT_PTR_NULL(fsdp_module_parent(child));
    fsdp_module_free(child);
    fsdp_module_free(root);
}

/* A module added under itself or under one of its descendants is refused (it was a stack
 * overflow: every walk of the tree went round the cycle), as is one that has a parent; the
 * tree stays as it was and the refused module is not freed (it is part of the tree). */
static void test_module_cycle(void) {
    fsdp_ctx *ctx = fsdp_test_ctx();
    fsdp_module *root, *mid, *leaf;
    FSDP_TEST_OK(fsdp_sequential_create(ctx, &root));
    FSDP_TEST_OK(fsdp_sequential_create(ctx, &mid));
    FSDP_TEST_OK(fsdp_linear_create(ctx, 2, 2, true, &leaf));
    FSDP_TEST_OK(fsdp_sequential_append(ctx, root, mid));
    FSDP_TEST_OK(fsdp_sequential_append(ctx, mid, leaf));

    FSDP_TEST_FAILS(fsdp_module_add_child(ctx, mid, "self", mid), FSDP_ERR_INVALID_ARGUMENT,
                    "Sequential '0'", "the parent", "cycle");
    FSDP_TEST_FAILS(fsdp_module_add_child(ctx, mid, "up", root), FSDP_ERR_INVALID_ARGUMENT,
                    "Sequential (root)", "an ancestor of the parent", "Sequential '0'", "cycle");
    FSDP_TEST_FAILS(fsdp_module_add_child(ctx, leaf, "up", root), FSDP_ERR_INVALID_ARGUMENT,
                    "an ancestor of the parent", "Linear '0.0'");
    FSDP_TEST_FAILS(fsdp_sequential_append(ctx, root, root), FSDP_ERR_INVALID_ARGUMENT,
                    "Sequential (root)", "the parent", "cycle");
    FSDP_TEST_FAILS(fsdp_module_add_child(ctx, root, "again", leaf), FSDP_ERR_INVALID_ARGUMENT,
                    "'0.0' already has a parent");

    /* Nothing changed: the same tree, names and parameters, and it still runs. */
    CU_ASSERT_EQUAL(fsdp_module_num_children(root), 1);
    CU_ASSERT_EQUAL(fsdp_module_num_children(mid), 1);
    CU_ASSERT_EQUAL(fsdp_module_num_children(leaf), 0);
    CU_ASSERT_PTR_NULL(fsdp_module_parent(root));
    CU_ASSERT_PTR_EQUAL(fsdp_module_parent(leaf), mid);
    CU_ASSERT_STRING_EQUAL(fsdp_module_fqn(leaf), "0.0");
    CU_ASSERT_EQUAL(fsdp_module_param_count(root), 6);
    const int64_t shape[2] = {3, 2};
    fsdp_tensor *x;
    const fsdp_tensor *y;
    FSDP_TEST_OK(fsdp_tensor_create(ctx, FSDP_DTYPE_F32, FSDP_CPU, 2, shape, &x));
    FSDP_TEST_OK(fsdp_module_forward(ctx, root, x, &y));
    CU_ASSERT_EQUAL(fsdp_tensor_dim(y, 0), 3);
    fsdp_tensor_free(x);
    fsdp_module_free(root);
}

int main(int argc, char **argv) {
    static const fsdp_test_case cases[] = {
        {"table_covers_headers", test_table_covers_headers},
        {"null_arguments", test_null_arguments},
        {"optional_only", test_optional_only},
        {"refusal_takes_nothing", test_refusal_takes_nothing},
        {"module_cycle", test_module_cycle},
    };
    return fsdp_test_run(argc, argv, "api_null", cases, sizeof cases / sizeof cases[0]);
}
