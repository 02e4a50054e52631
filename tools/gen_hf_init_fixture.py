#!/usr/bin/env python3
"""Generate the Hugging Face model directory fsdp-train starts from in tests/test_train_llama.c
([model] init = <directory>): tests/fixtures/hf_llama_init/ (config.json and model.safetensors
as LlamaForCausalLM.save_pretrained writes them) and tests/fixtures/hf_llama_init.bin, the loss
transformers computes on the sequences fsdp-train scores before its first step; and the same
with tied embeddings (tie_word_embeddings=True), tests/fixtures/hf_llama_tied/ (whose
model.safetensors has no lm_head.weight: transformers saves the shared tensor once) and
hf_llama_tied.bin. Needs `torch`
and `transformers` (pip); libfsdp's build and tests never do.

    python3 tools/gen_hf_init_fixture.py              # writes into tests/fixtures/
    python3 tools/gen_hf_init_fixture.py --out DIR

hf_llama_init.bin (format: tests/fixtures/README.md) holds:

    tokens   i32 (N): the token ids of the training text (vocabulary VOCAB), which the test
             writes as fsdp-train's token file
    probe    i32 (B, T + 1): the B probe sequences fsdp-train scores for its first loss with
             [data] batch_size = B, eval_batches = 1, eval_fraction = 0 (sequence j starts at
             floor(j (N - T - 1) / (B - 1)), train_tokens_probe_start)
    loss     f64 0-d: the mean cross-entropy of the model's logits for probe[:, :T] against
             probe[:, 1:], computed by transformers in float32

The weights are drawn wider than Hugging Face's initializer (std 0.15) and the norm weights
perturbed from ones, so that every path carries signal.
"""

import argparse
import os
import shutil
import sys
import warnings
import zlib


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    return ap.parse_args()


# The command line is read before torch's import (seconds), which --help and a bad option
# need not wait for.
ARGS = parse_args() if __name__ == "__main__" else None

warnings.filterwarnings("ignore")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import write_fixture  # noqa: E402

DIM, LAYERS, HEADS, KV_HEADS, VOCAB, FFN, MAX_POS = 32, 2, 4, 2, 64, 48, 16
EPS, THETA = 1e-5, 5000.0
N, B, T = 200, 4, 16  # T = MAX_POS: fsdp-train takes max_seq_len from the directory


def build(tie):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=DIM,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        intermediate_size=FFN,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=EPS,
        rope_theta=THETA,
        initializer_range=0.15,
        tie_word_embeddings=tie,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return model


def main(args):
    for name, tie in (("hf_llama_init", False), ("hf_llama_tied", True)):
        write_case(name, tie, args.out)


def write_case(name, tie, out_dir):
    torch.manual_seed(zlib.crc32(name.encode()))
    model = build(tie)
    tokens = torch.randint(0, VOCAB, (N,), dtype=torch.int64)
    starts = [j * (N - T - 1) // (B - 1) for j in range(B)]
    probe = torch.stack([tokens[s : s + T + 1] for s in starts])
    with torch.no_grad():
        logits = model(input_ids=probe[:, :T]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), probe[:, 1:].reshape(-1))
    if not torch.isfinite(loss):
        raise ValueError(f"{name}: the loss is not finite")
    d = os.path.join(out_dir, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    for extra in os.listdir(d):  # config.json and model.safetensors only
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, extra))
        else:
            os.chmod(os.path.join(d, extra), 0o644)
    if tie:  # transformers saves the shared tensor once, as the embedding
        from safetensors import safe_open

        with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
            assert "lm_head.weight" not in f.keys(), list(f.keys())
    tensors = [
        ("tokens", tokens.to(torch.int32)),
        ("probe", probe.to(torch.int32)),
        ("loss", loss.to(torch.float64)),
    ]
    path = os.path.join(out_dir, name + ".bin")
    size = write_fixture(path, tensors)
    print(f"{path}: {size} bytes, loss {loss.item():.6f}; {d}: {sorted(os.listdir(d))}")


if __name__ == "__main__":
    main(ARGS)
