#!/usr/bin/env python3
"""llama_cpu.py: the PyTorch side of bench/llama.sh: one training step (forward, cross-entropy,
backward, AdamW, zero_grad) of transformers' LlamaForCausalLM on the CPU, float32, eager
attention, with the configuration, batch, sequence length, step counts and thread count of
bench_llama (same options). Prints the phases and a line
    pytorch step_ms MS tokens_per_s TPS
Needs: pip install torch transformers.
"""
import argparse
import statistics
import time


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in [("batch", 2), ("seq", 64), ("steps", 5), ("warmup", 2), ("threads", 0),
                          ("dim", 768), ("layers", 8), ("heads", 12), ("kv-heads", 4),
                          ("ffn", 2048), ("vocab", 32000)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--big", action="store_true", help="batch 4, seq 512")
    p.add_argument("--no-profile", action="store_true", help="accepted, for the same options")
    a = p.parse_args()
    import torch  # after --help, which needs none
    from transformers import LlamaConfig, LlamaForCausalLM

    if a.big:
        a.batch, a.seq = 4, 512
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    cfg = LlamaConfig(hidden_size=a.dim, intermediate_size=a.ffn, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, num_hidden_layers=a.layers,
                      vocab_size=a.vocab, max_position_embeddings=max(2048, a.seq),
                      rms_norm_eps=1e-6, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=torch.Generator().manual_seed(2))
    n_params = sum(x.numel() for x in model.parameters())
    print(f"pytorch llama: {n_params / 1e6:.1f} M parameters, batch {a.batch} x seq {a.seq}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{model.config._attn_implementation} attention, "
          f"{a.warmup} warm-up + {a.steps} timed steps")
    phases = {"forward+loss": [], "backward": [], "adamw+zero": [], "step": []}
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t3 = time.perf_counter()
        if step >= a.warmup:
            for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                phases[k].append(v)
    med = {k: statistics.median(v) for k, v in phases.items()}
    print(f"loss after the last step {loss.item():.4f}")
    for k in ("forward+loss", "backward", "adamw+zero"):
        print(f"  {k:<12} {1e3 * med[k]:9.1f} ms  {100 * med[k] / med['step']:5.1f}%")
    fb = statistics.median(f + b for f, b in zip(phases["forward+loss"], phases["backward"]))
    print(f"pytorch fwd_bwd_ms {1e3 * fb:.2f} (forward, loss and backward, without the optimizer)")
    print(f"pytorch step_ms {1e3 * med['step']:.2f} tokens_per_s "
          f"{a.batch * a.seq / med['step']:.1f}")


if __name__ == "__main__":
    main()
