/* ckpt_generate.h: fsdp-ckpt's commands that use a trained Llama (ckpt_generate.c): generate
 * and eval. Each takes the context, the command's arguments (argv[0] is its name) and returns
 * the tool's exit status (ckpt_cli.h). */
#ifndef FSDP_TOOLS_CKPT_GENERATE_H
#define FSDP_TOOLS_CKPT_GENERATE_H

#include "fsdp/fsdp.h"

int ckpt_cmd_generate(fsdp_ctx *ctx, int argc, char **argv);
int ckpt_cmd_eval(fsdp_ctx *ctx, int argc, char **argv);

#endif
