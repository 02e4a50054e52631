#!/usr/bin/env python3
"""Generate tests/fixtures/llama_tiny.bin: a tiny Hugging Face LlamaForCausalLM (float32, CPU,
eager attention) run forward and backward on a batch of token sequences, for
tests/test_llama.c; and tests/fixtures/llama_tiny.safetensors, the same model's state_dict()
as Hugging Face saves it, which the test imports by name; and tests/fixtures/llama_rope3.bin,
the same kind of model with Llama 3's rope scaling (rope_scaling rope_type "llama3", factor 8,
low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 64: with head size 8 and
theta 5000 its four frequencies' wavelengths, 6.3, 53, 444 and 3737, fall in the kept, the
interpolated and the divided ranges); and tests/fixtures/llama_tied.bin, the same kind of model
with tied embeddings (tie_word_embeddings=True: lm_head uses model.embed_tokens.weight, which is
listed once, its gradient the sum of both uses). Needs `transformers` (pip); libfsdp's build and
tests never do.

    python3 tools/gen_llama_fixture.py                # writes all four into tests/fixtures/
    python3 tools/gen_llama_fixture.py --only llama_rope3
    python3 tools/gen_llama_fixture.py --out DIR

The file (format: tests/fixtures/README.md, written by gen_fixtures.write_fixture) holds:

    config        i32 (7): dim, n_layers, n_heads, n_kv_heads, vocab_size, ffn_hidden,
                  max_seq_len
    config_f      f64 (2): rms_norm_eps, rope_theta
    rope_scaling  f64 (4): factor, low_freq_factor, high_freq_factor,
                  original_max_position_embeddings (llama_rope3.bin only)
    tokens        i32 (B, T): input_ids
    targets       i32 (B, T): labels shifted left by one, -100 at the last position and where
                  the labels are padding: what the C test passes to its cross-entropy
    <param>       every parameter by its Hugging Face name, in named_parameters() order
    logits        (B, T, vocab)
    loss          0-d: model(input_ids, labels=labels).loss (mean over non-ignored targets)
    grad.<param>  d(loss)/d<param>, same order

The weights are drawn wider than Hugging Face's initializer (std 0.15) and the norm weights
perturbed from ones, so attention is far from uniform and every path carries signal.
"""

import argparse
import os
import sys
import warnings
import zlib

DIM, LAYERS, HEADS, KV_HEADS, VOCAB, FFN, MAX_SEQ = 32, 2, 4, 2, 64, 48, 16
EPS, THETA = 1e-5, 5000.0
B, T = 2, 8


ROPE3 = (8.0, 1.0, 4.0, 64)  # factor, low_freq_factor, high_freq_factor, original max
CASES = ("llama_tiny", "llama_rope3", "llama_tied")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    ap.add_argument("--only", choices=list(CASES))
    return ap.parse_args()


# The command line is read before torch's import (seconds), which --help and a bad option
# need not wait for.
ARGS = parse_args() if __name__ == "__main__" else None

warnings.filterwarnings("ignore")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import write_fixture  # noqa: E402


def build(rope_scaling=None, tie=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=DIM,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        intermediate_size=FFN,
        max_position_embeddings=MAX_SEQ,
        rms_norm_eps=EPS,
        rope_theta=THETA,
        rope_scaling=rope_scaling,
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
    for case in CASES:
        if args.only in (None, case):
            write_case(case, args.out)


def write_case(case, out_dir):
    rope3 = case == "llama_rope3"
    torch.manual_seed(zlib.crc32(case.encode()))
    scaling = None
    if rope3:
        f, lo, hi, orig = ROPE3
        scaling = {"rope_type": "llama3", "factor": f, "low_freq_factor": lo,
                   "high_freq_factor": hi, "original_max_position_embeddings": orig}
    tied = case == "llama_tied"
    model = build(scaling, tie=tied)
    if tied:  # one parameter: named_parameters() lists the embedding alone
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert "lm_head.weight" not in dict(model.named_parameters())
    hd = DIM // HEADS
    default = 1.0 / (THETA ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    scaled = not torch.equal(model.model.rotary_emb.inv_freq, default)
    assert scaled == rope3, (case, model.model.rotary_emb.inv_freq, default)
    tokens = torch.randint(0, VOCAB, (B, T), dtype=torch.int64)
    labels = tokens.clone()
    labels[0, 3] = -100  # padding in the middle of a sequence
    labels[1, 6] = -100
    out = model(input_ids=tokens, labels=labels)
    out.loss.backward()
    targets = torch.full((B, T), -100, dtype=torch.int64)
    targets[:, :-1] = labels[:, 1:]
    # the C cross-entropy over the shifted targets must be Hugging Face's loss
    check = torch.nn.functional.cross_entropy(
        out.logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100
    )
    assert torch.allclose(check, out.loss), (check, out.loss)
    params = list(model.named_parameters())
    tensors = [
        ("config", torch.tensor([DIM, LAYERS, HEADS, KV_HEADS, VOCAB, FFN, MAX_SEQ]).int()),
        ("config_f", torch.tensor([EPS, THETA], dtype=torch.float64)),
    ]
    if rope3:
        tensors += [("rope_scaling", torch.tensor(ROPE3, dtype=torch.float64))]
    tensors += [
        ("tokens", tokens.to(torch.int32)),
        ("targets", targets.to(torch.int32)),
    ]
    tensors += [(n, p) for n, p in params]
    tensors += [("logits", out.logits), ("loss", out.loss)]
    tensors += [("grad." + n, p.grad) for n, p in params]
    for name, t in tensors:
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise ValueError(f"{case}: {name} is not finite")
    path = os.path.join(out_dir, case + ".bin")
    size = write_fixture(path, tensors)
    print(f"{path}: {len(tensors)} tensors, {size} bytes, loss {out.loss.item():.6f}")
    if case != "llama_tiny":
        return
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    st_path = os.path.join(out_dir, "llama_tiny.safetensors")
    save_file(state, st_path)
    print(f"{st_path}: {len(state)} tensors, {os.path.getsize(st_path)} bytes")


if __name__ == "__main__":
    main(ARGS)
