#!/usr/bin/env python3
"""llama_gpu.py: PyTorch's side of bench/llama_gpu.sh: one Llama training step (forward,
cross-entropy, backward, fused AdamW) per shape, mode and execution (eager with
scaled_dot_product_attention, and torch.compile), as the median of the timed steps, tokens/s
and MFU. The model is written here (no transformers import) as libfsdp's Llama is built:
Hugging Face's layout (RMSNorm eps 1e-6, rotate_half RoPE with theta 10000, SwiGLU MLP, no
biases, untied lm_head), every projection and the embedding ~ normal(0, 0.02), norm weights 1.
Modes: f32 (TF32 off), tf32 (matmul and cuDNN TF32 on), bf16 (autocast to bfloat16 over f32
master weights, the loss in f32). The batch is libfsdp's: token i of a row predicts token i+1,
the last of each row is ignored. Prints one line per run:
    result torch-eager|torch-compile SHAPE MODE step_ms MS tokens_per_s TPS mfu X peak_mib P
        loss L (warm-up W s, N M parameters)   (one line)
    skip torch-eager|torch-compile SHAPE MODE: REASON
P: torch.cuda.max_memory_allocated() in MiB over the run's warm-up and timed steps (the
caching allocator's peak in use; its statistics reset after the model and optimizer are
built), n/a on the CPU.
--checkpoint: every decoder layer under torch.utils.checkpoint.checkpoint(use_reentrant=False)
(checkpoint_wrapper's non-reentrant checkpointing: the layer's activations are recomputed in
backward); MODE is then written f32+ckpt, tf32+ckpt, bf16+ckpt. Not with --breakdown.
and, per shape and mode, the SDPA backend that ran. Runs that would pass --budget-s are
skipped with the reason. --device cpu runs the tiny shape on the CPU (a check of the script).
--breakdown: after each eager run's timed steps, --breakdown-steps more with hooks that
synchronise the device at the start and end of every timed module's forward and backward, as
bench_llama_gpu --breakdown does, and lines in its format (PyTorch's loss is inside the model's
forward: its part is the forward after lm_head plus the backward before lm_head's):
    breakdown torch-eager SHAPE MODE PART fwd_ms X bwd_ms Y share Z
    breakdown torch-eager SHAPE MODE total step_ms X parts_ms Y timed_step_ms Z steps N
        idle_sync_us S loss L   (one line)
"""
import argparse
import statistics
import sys
import time

SHAPES = {  # dim, layers, heads, kv heads, ffn, vocab, seq, batch
    "S": (768, 12, 12, 4, 2048, 32000, 1024, 16),
    "M": (2048, 16, 32, 8, 8192, 128256, 2048, 4),
    "tiny": (64, 2, 4, 2, 128, 256, 32, 2),
}
MODES = ("f32", "tf32", "bf16")
# bench/llama_breakdown.h's parts, in its order.
PARTS = ("embedding", "input_norm", "attn_proj", "attn_core", "post_attn_norm", "mlp_proj",
         "mlp_rest", "residual", "final_norm", "lm_head", "loss", "optimizer", "other")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="S,M")
    p.add_argument("--modes", default="bf16,tf32,f32")
    p.add_argument("--executions", default="eager,compile")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=600)
    p.add_argument("--min-compile-s", type=float, default=60,
                   help="the least budget left worth starting a torch.compile run with")
    p.add_argument("--peaks", default="0,0,0", help="TFLOP/s of f32, tf32, bf16 (for MFU)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--breakdown", action="store_true",
                   help="time each part of the eager step after the timed steps")
    p.add_argument("--breakdown-steps", type=int, default=0,
                   help="the steps the breakdown times (default 5; implies --breakdown)")
    p.add_argument("--checkpoint", action="store_true",
                   help="checkpoint every decoder layer (non-reentrant); modes written MODE+ckpt")
    a = p.parse_args()
    if a.breakdown and not a.breakdown_steps:
        a.breakdown_steps = 5
    if not 0 <= a.breakdown_steps <= 100:
        p.error(f"--breakdown-steps {a.breakdown_steps}: give 1..100")
    if a.checkpoint and a.breakdown_steps:
        p.error("--checkpoint with --breakdown is not supported: the breakdown's hooks would time "
                "each layer's recompute, which runs in backward, as forward time")
    a.peaks = [float(x) for x in a.peaks.split(",")]
    a.shapes, a.modes = a.shapes.split(","), a.modes.split(",")
    a.executions = a.executions.split(",")
    bad = [s for s in a.shapes if s not in SHAPES] + [m for m in a.modes if m not in MODES] + \
        [e for e in a.executions if e not in ("eager", "compile")]
    if bad or len(a.peaks) != 3 or a.steps < 1 or a.warmup < 1:
        p.error(f"unknown names {bad} or bad --peaks/--steps/--warmup")
    return a


# The command line is read before torch's import (seconds), which --help and a bad option
# need not wait for.
ARGS = parse_args() if __name__ == "__main__" else None

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads, gqa):
        super().__init__()
        self.heads, self.kv_heads, self.hd, self.gqa = heads, kv_heads, dim // heads, gqa
        self.q_proj = nn.Linear(dim, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q = (q * cos + rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + rotate_half(k) * sin).to(v.dtype)
        if self.gqa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn, gqa):
        super().__init__()
        self.self_attn = Attention(dim, heads, kv_heads, gqa)
        self.mlp = MLP(dim, ffn)
        self.input_layernorm = RMSNorm(dim)
        self.post_attention_layernorm = RMSNorm(dim)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Llama(nn.Module):
    def __init__(self, dim, layers, heads, kv_heads, ffn, vocab, seq, gqa, ckpt=False):
        super().__init__()
        self.ckpt = ckpt
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, heads, kv_heads, ffn, gqa) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        hd = dim // heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        for name, p in self.named_parameters():
            if not name.endswith("layernorm.weight") and name != "norm.weight":
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, ids, targets):
        x = self.embed_tokens(ids)
        T = ids.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        for layer in self.layers:
            if self.ckpt:
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1),
                               ignore_index=-100)


def flop_per_token(shape, params):
    """6N + 12 L d T, N the parameters less the input embedding table (a lookup)."""
    dim, layers, _, _, _, vocab, seq, _ = SHAPES[shape]
    return 6.0 * (params - vocab * dim) + 12.0 * layers * dim * seq


def batch(shape, device):
    """libfsdp's tokens (bench_llama_gpu.c's generator) and next-token targets."""
    _, _, _, _, _, vocab, seq, bsz = SHAPES[shape]
    ids, lcg = [], 12345
    for _ in range(bsz * seq):
        lcg = (lcg * 1664525 + 1013904223) & 0xFFFFFFFF
        ids.append((lcg >> 8) % vocab)
    t = torch.tensor(ids, dtype=torch.long).view(bsz, seq)
    tgt = torch.full_like(t, -100)
    tgt[:, :-1] = t[:, 1:]
    return t.to(device), tgt.to(device)


def set_mode(mode):
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"


def sdpa_backend(model, ids, tgt, mode, device):
    """The aten SDPA kernel a forward calls (which backend the dispatcher chose)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.no_grad(), autocast(mode, device):
            model(ids, tgt)
    names = {e.name for e in prof.events() if e.name.startswith("aten::_scaled_dot_product")}
    names.discard("aten::_scaled_dot_product_attention")
    return ", ".join(sorted(names)) or "none found (math composite)"


def autocast(mode, device):
    return torch.autocast(device, dtype=torch.bfloat16, enabled=mode == "bf16")


class Breakdown:
    """Per-part forward and backward time of eager steps: each timed module's time goes to its
    part and comes out of its parent's (a layer's residual part is the layer less its four
    children, attn_core the attention less its projections, mlp_rest the MLP less its
    projections). The embedding's backward runs last and its inputs need no gradient (no
    backward-end hook fires): it ends with the backward."""

    def __init__(self, model, sync):
        self.sync, self.handles, self.rec, self.mark = sync, [], [], {}
        targets = [(model.embed_tokens, "embedding", None), (model.norm, "final_norm", None),
                   (model.lm_head, "lm_head", None)]
        for layer in model.layers:
            a, f = layer.self_attn, layer.mlp
            targets += [(layer, "residual", None), (layer.input_layernorm, "input_norm", "residual"),
                        (a, "attn_core", "residual"), (a.q_proj, "attn_proj", "attn_core"),
                        (a.k_proj, "attn_proj", "attn_core"), (a.v_proj, "attn_proj", "attn_core"),
                        (a.o_proj, "attn_proj", "attn_core"),
                        (layer.post_attention_layernorm, "post_attn_norm", "residual"),
                        (f, "mlp_rest", "residual"), (f.gate_proj, "mlp_proj", "mlp_rest"),
                        (f.up_proj, "mlp_proj", "mlp_rest"), (f.down_proj, "mlp_proj", "mlp_rest")]
        for mod, add, sub in targets:
            self._hook(mod, add, sub)
        t = []
        for _ in range(21):
            t0 = time.perf_counter()
            sync()
            t.append(time.perf_counter() - t0)
        self.idle_sync_us = 1e6 * statistics.median(t)

    def _hook(self, mod, add, sub):
        start = {}

        def begin(phase):
            def hook(*_):
                self.sync()
                start[phase] = time.perf_counter()
                if mod is self.lm_head_of and phase == 1:
                    self.mark["lm_head_bwd"] = start[phase]
            return hook

        def end(phase):
            def hook(*_):
                self.sync()
                now = time.perf_counter()
                self.acc[phase][add] += now - start[phase]
                if sub:
                    self.acc[phase][sub] -= now - start[phase]
                if add == "lm_head" and phase == 0:
                    self.mark["lm_head_fwd"] = now
            return hook

        if add == "lm_head":
            self.lm_head_of = mod
        self.handles += [mod.register_forward_pre_hook(begin(0)), mod.register_forward_hook(end(0)),
                         mod.register_full_backward_pre_hook(begin(1))]
        if add == "embedding":
            self.embedding_start = start
        else:
            self.handles.append(mod.register_full_backward_hook(end(1)))

    lm_head_of = None

    def step(self, model, opt, ids, tgt, mode, device):
        """One step with every part timed; returns the loss."""
        self.acc = ({p: 0.0 for p in PARTS}, {p: 0.0 for p in PARTS})
        self.sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        with autocast(mode, device):
            loss = model(ids, tgt)
        self.sync()
        t_fwd = time.perf_counter()
        loss.backward()
        self.sync()
        t_bwd = time.perf_counter()
        opt.step()
        self.sync()
        t_end = time.perf_counter()
        fwd, bwd = self.acc
        bwd["embedding"] += t_bwd - self.embedding_start[1]
        fwd["loss"] = t_fwd - self.mark["lm_head_fwd"]
        bwd["loss"] = self.mark["lm_head_bwd"] - t_fwd
        fwd["optimizer"] = t_end - t_bwd
        self.rec.append((dict(fwd), dict(bwd), t_end - t0, t_fwd - t0))
        return loss

    def detach(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def print(self, tag, timed_ms, loss):
        """As llama_breakdown_report: the median of each part, and other from the medians (the
        forward phase less its parts, then the step less every part), so the shares sum to 1."""
        med = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
        step = med([r[2] for r in self.rec])
        f = {p: med([r[0][p] for r in self.rec]) for p in PARTS[:-1]}
        b = {p: med([r[1][p] for r in self.rec]) for p in PARTS[:-1]}
        parts = sum(f.values()) + sum(b.values())
        f["other"] = med([r[3] for r in self.rec]) - sum(f[p] for p in PARTS[:-2])
        b["other"] = step - parts - f["other"]
        for p in PARTS:
            print(f"breakdown {tag} {p} fwd_ms {f[p]:.3f} bwd_ms {b[p]:.3f} "
                  f"share {(f[p] + b[p]) / step if step > 0 else 0:.4f}")
        print(f"breakdown {tag} total step_ms {step:.3f} parts_ms {parts:.3f} timed_step_ms "
              f"{timed_ms:.3f} steps {len(self.rec)} idle_sync_us {self.idle_sync_us:.1f} "
              f"loss {loss:.9g}", flush=True)


class Runner:
    def __init__(self, a):
        self.a = a
        self.deadline = time.perf_counter() + a.budget_s
        self.device = a.device
        self.gqa = "enable_gqa" in F.scaled_dot_product_attention.__doc__

    def left(self):
        return self.deadline - time.perf_counter()

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def step(self, model, opt, ids, tgt, mode):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        with autocast(mode, self.device):
            loss = model(ids, tgt)
        loss.backward()
        opt.step()
        self.sync()
        return time.perf_counter() - t0, loss

    def one(self, shape, mode, execution):
        """Times one (shape, mode, execution); prints its result or skip line."""
        a = self.a
        tag = f"torch-{execution} {shape} {mode}{'+ckpt' if a.checkpoint else ''}"
        if self.left() < (a.min_compile_s if execution == "compile" else 5):
            print(f"skip {tag}: {max(self.left(), 0):.0f} s of the budget left", flush=True)
            return
        set_mode(mode)
        torch.manual_seed(1)
        dim, layers, heads, kv, ffn, vocab, seq, bsz = SHAPES[shape]
        model = Llama(dim, layers, heads, kv, ffn, vocab, seq, self.gqa,
                      a.checkpoint).to(self.device)
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01,
                                fused=self.device == "cuda")
        ids, tgt = batch(shape, self.device)
        if execution == "eager" and (shape, mode) not in self.backends:
            self.backends[(shape, mode)] = sdpa_backend(model, ids, tgt, mode, self.device)
            print(f"sdpa {shape} {mode}: {self.backends[(shape, mode)]} "
                  f"({'enable_gqa' if self.gqa else 'k, v repeated to the query heads'})",
                  flush=True)
        run = torch.compile(model) if execution == "compile" else model
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        last = 0.0
        for _ in range(a.warmup + (1 if execution == "compile" else 0)):
            last, loss = self.step(run, opt, ids, tgt, mode)
        warm = time.perf_counter() - t0
        if last * a.steps > self.left():
            print(f"skip {tag}: a step takes {last:.2f} s, so {a.steps} steps need "
                  f"{last * a.steps:.0f} s; {max(self.left(), 0):.0f} s of the budget are left",
                  flush=True)
            return
        times = [self.step(run, opt, ids, tgt, mode) for _ in range(a.steps)]
        sec = statistics.median(t for t, _ in times)
        tps = bsz * seq / sec
        peak = a.peaks[MODES.index(mode)]
        mfu = f"{tps * flop_per_token(shape, params) / (peak * 1e12):.4f}" if peak > 0 else "n/a"
        mib = "n/a"
        if self.device == "cuda":
            mib = f"{torch.cuda.max_memory_allocated() / 2**20:.1f}"
        print(f"result {tag} step_ms {1e3 * sec:.2f} tokens_per_s {tps:.1f} mfu {mfu} "
              f"peak_mib {mib} loss {times[-1][1].item():.9g} (warm-up {warm:.1f} s, "
              f"{params / 1e6:.1f} M parameters)", flush=True)
        if a.breakdown_steps and execution == "eager":
            if last * 2 * a.breakdown_steps > self.left():
                print(f"skip breakdown {tag}: {max(self.left(), 0):.0f} s of the budget left",
                      flush=True)
                return
            bd = Breakdown(model, self.sync)
            try:
                for _ in range(a.breakdown_steps):
                    loss = bd.step(model, opt, ids, tgt, mode, self.device)
            finally:
                bd.detach()
            bd.print(tag, 1e3 * sec, loss.item())

    def run(self, plan):
        self.backends = {}
        for shape, mode, execution in plan:
            try:
                self.one(shape, mode, execution)
            except torch.cuda.OutOfMemoryError as e:
                print(f"skip torch-{execution} {shape} {mode}: out of memory: "
                      f"{str(e).splitlines()[0]}", flush=True)
            except Exception as e:  # a failed run must not cost the others their figures
                print(f"skip torch-{execution} {shape} {mode}: failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)
            if execution == "compile":
                torch._dynamo.reset()
            if self.device == "cuda":
                torch.cuda.empty_cache()


def main(a):
    if a.device == "cuda" and not torch.cuda.is_available():
        print("llama_gpu.py: skipped: torch.cuda.is_available() is False")
        return 0
    where = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    print(f"pytorch {torch.__version__} on {where}: fused AdamW (lr 1e-4, weight decay 0.01), "
          f"{a.warmup} warm-up (+1 for compile) + median of {a.steps} timed steps, "
          f"budget {a.budget_s:.0f} s"
          f"{', every decoder layer checkpointed' if a.checkpoint else ''}", flush=True)
    # Every eager run, then every compile run, each in the order of --modes then --shapes: by
    # default bf16 first (the goals), then the modes libfsdp has, and the compiles (the slowest
    # to start) last, so a short budget loses the least.
    plan = [(s, m, e) for e in a.executions for m in a.modes for s in a.shapes]
    Runner(a).run(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
