#!/usr/bin/env python3
"""Generate tests/fixtures/llama_tiny.bin: a tiny Hugging Face LlamaForCausalLM (float32, CPU,
eager attention) run forward and backward on a batch of token sequences, for
tests/test_llama.c; and tests/fixtures/llama_tiny.safetensors, the same model's state_dict()
as Hugging Face saves it, which the test imports by name. Needs `transformers` (pip);
libfsdp's build and tests never do.

    python3 tools/gen_llama_fixture.py                # writes both into tests/fixtures/
    python3 tools/gen_llama_fixture.py --out DIR

The file (format: tests/fixtures/README.md, written by gen_fixtures.write_fixture) holds:

    config        i32 (7): dim, n_layers, n_heads, n_kv_heads, vocab_size, ffn_hidden,
                  max_seq_len
    config_f      f64 (2): rms_norm_eps, rope_theta
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

warnings.filterwarnings("ignore")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import write_fixture  # noqa: E402

DIM, LAYERS, HEADS, KV_HEADS, VOCAB, FFN, MAX_SEQ = 32, 2, 4, 2, 64, 48, 16
EPS, THETA = 1e-5, 5000.0
B, T = 2, 8


def build():
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
        initializer_range=0.15,
        tie_word_embeddings=False,
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    args = ap.parse_args(argv)
    torch.manual_seed(zlib.crc32(b"llama_tiny"))
    model = build()
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
        ("tokens", tokens.to(torch.int32)),
        ("targets", targets.to(torch.int32)),
    ]
    tensors += [(n, p) for n, p in params]
    tensors += [("logits", out.logits), ("loss", out.loss)]
    tensors += [("grad." + n, p.grad) for n, p in params]
    for name, t in tensors:
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise ValueError(f"llama_tiny: {name} is not finite")
    path = os.path.join(args.out, "llama_tiny.bin")
    size = write_fixture(path, tensors)
    print(f"{path}: {len(tensors)} tensors, {size} bytes, loss {out.loss.item():.6f}")
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    st_path = os.path.join(args.out, "llama_tiny.safetensors")
    save_file(state, st_path)
    print(f"{st_path}: {len(state)} tensors, {os.path.getsize(st_path)} bytes")


if __name__ == "__main__":
    main()
