#!/usr/bin/env python3
"""libfsdp's Llama against transformers' LlamaForCausalLM, through Hugging Face model directories.

Export: tests/hf_llama_driver.c trains a small Llama for 3 AdamW steps under FSDP on 2 rank
threads, saves a checkpoint with its config.json attached and writes the logits of a fixed batch;
`fsdp-ckpt export --format hf` makes a model directory; transformers loads it with
from_pretrained (no missing, unexpected or mismatched key) and its logits on the same batch must
match libfsdp's to 1e-4 relative (max |difference| over max |logit|).

Import: transformers makes a Llama of another shape (its own random weights) and saves it
sharded (save_pretrained with a small max_shard_size, so model.safetensors.index.json);
`fsdp-ckpt import DIR` makes a checkpoint; the driver builds the Llama its stored config.json
describes, loads it and computes logits, which must match transformers' to 1e-4; and `export
--format hf` of the imported checkpoint gives back every tensor bitwise.

Run by CTest (entry check_hf_export) with the build's driver and fsdp-ckpt, or by hand:
    python3 tools/check_hf_export.py --driver build/tests/hf_llama_driver \
        --fsdp-ckpt build/fsdp-ckpt
Exits 77 (CTest's skip) with the reason when torch or transformers cannot be imported.
Needs: pip install torch transformers safetensors.
"""
import argparse
import os
import subprocess
import sys
import tempfile

SKIP = 77
RTOL = 1e-4


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout, end="", flush=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {cmd[0]} exited {r.returncode}")


def rel_diff(got, want):
    return float((got - want).abs().max() / want.abs().max())


def check(name, diff):
    ok = diff <= RTOL
    print(f"{name}: max |difference| / max |logit| = {diff:.3g} "
          f"({'ok' if ok else 'FAILED'}, rtol {RTOL:g})", flush=True)
    return ok


def torch_logits(model, tokens):
    import torch
    with torch.no_grad():
        return model(input_ids=tokens).logits


def load_hf(path):
    from transformers import LlamaForCausalLM
    import torch
    model, info = LlamaForCausalLM.from_pretrained(
        path, output_loading_info=True, attn_implementation="eager")
    model = model.to(torch.float32)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"} or (
        {"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {})
    if bad:
        sys.exit(f"FAILED: from_pretrained({path}) reported {bad}")
    return model.eval()


def export_direction(args, tmp):
    import torch
    work = os.path.join(tmp, "export")
    os.makedirs(work)
    run([args.driver, "train", work, "--ranks", "2"])
    hf = os.path.join(work, "hf")
    run([args.fsdp_ckpt, "export", "--format", "hf", os.path.join(work, "ckpt"), "--out", hf])
    b, t, v = (int(x) for x in open(os.path.join(work, "shape.txt")).read().split())
    tokens = torch.frombuffer(bytearray(open(os.path.join(work, "tokens.i32"), "rb").read()),
                              dtype=torch.int32).reshape(b, t).long()
    want = torch.frombuffer(bytearray(open(os.path.join(work, "logits.f32"), "rb").read()),
                            dtype=torch.float32).reshape(b, t, v)
    model = load_hf(hf)
    cfg = model.config
    print(f"loaded {hf}: hidden {cfg.hidden_size}, layers {cfg.num_hidden_layers}, heads "
          f"{cfg.num_attention_heads}/{cfg.num_key_value_heads}, rms_norm_eps {cfg.rms_norm_eps}",
          flush=True)
    return check("export: transformers on the exported model vs libfsdp",
                 rel_diff(torch_logits(model, tokens), want))


def import_direction(args, tmp):
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM
    work = os.path.join(tmp, "import")
    os.makedirs(work)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=40, num_attention_heads=4,
                      num_key_value_heads=1, num_hidden_layers=3, vocab_size=50,
                      max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      initializer_range=0.05)
    model = LlamaForCausalLM(cfg).eval()
    # Norm weights away from their initial ones, so a norm loaded wrongly shows.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    src = os.path.join(work, "hf")
    model.save_pretrained(src, max_shard_size="20KB", safe_serialization=True)
    shards = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    print(f"saved {src}: {len(shards)} safetensors shards and "
          f"{'an' if os.path.exists(os.path.join(src, 'model.safetensors.index.json')) else 'no'}"
          " index", flush=True)
    ckpt = os.path.join(work, "ckpt")
    run([args.fsdp_ckpt, "import", src, "--out", ckpt])
    tokens = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    tok_path = os.path.join(work, "tokens.i32")
    tokens.to(torch.int32).numpy().tofile(tok_path)
    out = os.path.join(work, "logits.f32")
    run([args.driver, "logits", os.path.join(ckpt, "step-00000000"), tok_path, "2", "9", out])
    got = torch.from_numpy(__import__("numpy").fromfile(out, dtype="float32")).reshape(
        2, 9, cfg.vocab_size)
    ok = check("import: libfsdp on the imported sharded model vs transformers",
               rel_diff(got, torch_logits(model, tokens)))
    back = os.path.join(work, "back")
    run([args.fsdp_ckpt, "export", "--format", "hf", ckpt, "--out", back])
    sd, exported = model.state_dict(), load_file(os.path.join(back, "model.safetensors"))
    same = sd.keys() == exported.keys() and all(torch.equal(sd[k], exported[k]) for k in sd)
    print(f"import then export: {len(exported)} tensors, "
          f"{'bitwise equal to' if same else 'DIFFERENT from'} the saved model", flush=True)
    return ok and same


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--driver", required=True, help="tests/hf_llama_driver of a build")
    p.add_argument("--fsdp-ckpt", required=True, help="the build's fsdp-ckpt")
    p.add_argument("--keep", help="work in this directory and keep it")
    args = p.parse_args()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import safetensors  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"skipped: this check needs torch, transformers, safetensors and numpy in python3 "
              f"({e}); pip install torch transformers safetensors")
        return SKIP
    torch.set_num_threads(1)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=args.keep)
        ok = export_direction(args, tmp) & import_direction(args, tmp)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            ok = export_direction(args, tmp) & import_direction(args, tmp)
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
