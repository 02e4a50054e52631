#!/usr/bin/env python3
"""fsdp-ckpt generate against transformers' generate on the same trained Llama.

fsdp-train trains the byte-level Llama (vocab 256, grouped-query heads) for 30 AdamW steps on one
rank; `fsdp-ckpt generate --ids` continues a prompt greedily through libfsdp's key/value cache;
`fsdp-ckpt export --format hf` writes the checkpoint as a Hugging Face model directory, and
transformers' LlamaForCausalLM.from_pretrained(...).generate(do_sample=False) continues the same
prompt from it. The tokens must be the same; where they differ, transformers' own logits at that
step (a full forward over libfsdp's sequence) must hold a tie: libfsdp's token within 1e-4 of the
largest logit's magnitude of the largest (the float32 bound tools/check_hf_export.py uses for the
logits of the two implementations).

The exported directory of the byte-level model has its tokenizer (tokenizer.json): where
transformers imports (tokenizers is all it needs for this), AutoTokenizer.from_pretrained must
encode the prompt as its bytes and decode libfsdp's tokens to the text `fsdp-ckpt generate`
prints; this part runs (and can fail) even when torch is missing, before the skip.

Run by CTest (entry check_hf_generate, and check_hf_generate_rope3 with
--set model.rope_scaling=llama3 --set model.rope_original_max_len=100 --rope-type llama3: Llama
3's rope scaling through generate and the export's config.json, which transformers must read as
llama3 with scaled frequencies; and check_hf_generate_tied with --set model.tie_embeddings=true
--tied: an export without lm_head.weight that transformers loads with lm_head tied) with the build's tools, or by hand:
    python3 tools/check_hf_generate.py --fsdp-train build/fsdp-train \\
        --fsdp-ckpt build/fsdp-ckpt [--set section.key=value ...]
Exits 77 (CTest's skip) with the reason when torch or transformers cannot be imported.
Needs: pip install torch transformers safetensors.
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
RTOL = 1e-4
PROMPT = "the cat "
NEW = 16


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout, end="", flush=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {cmd[0]} exited {r.returncode}")
    return r.stdout


def write_tokens(path, n=6000):
    """Words of a small vocabulary drawn by a fixed LCG, as bytes, in a token file."""
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    s, ids = 12345, []
    while len(ids) < n:
        s = (s * 1103515245 + 12345) & 0xFFFFFFFF
        ids += list(words[(s >> 16) % 8].encode()) + [ord(" ")]
    ids = ids[:n]
    with open(path, "wb") as f:
        f.write(b"FSDPTOK\0" + struct.pack("<IIQQ", 1, 2, len(ids), 256))
        f.write(struct.pack(f"<{len(ids)}H", *ids))


def train(args, work):
    tok = os.path.join(work, "text.tok")
    write_tokens(tok)
    ini = os.path.join(work, "run.ini")
    with open(ini, "w") as f:
        f.write(f"""[model]
kind = llama
dim = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
vocab_size = 256
ffn_hidden = 64
max_seq_len = 32
[parallel]
ranks = 1
[data]
kind = tokens
path = {tok}
eval_fraction = 0.1
batch_size = 4
seed = 1
[optim]
name = adamw
lr = 0.01
[train]
steps = 30
log_every = 10
[checkpoint]
dir = {work}/run
every = 30
""")
    sets = [a for kv in args.set for a in ("--set", kv)]
    run([args.fsdp_train, "--config", ini] + sets)
    return os.path.join(work, "run")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fsdp-train", required=True, help="the build's fsdp-train")
    p.add_argument("--fsdp-ckpt", required=True, help="the build's fsdp-ckpt")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="passed to fsdp-train (e.g. model.rope_scaling=llama3)")
    p.add_argument("--rope-type", default="default",
                   help="the rope_type transformers must read from the exported config.json")
    p.add_argument("--tied", action="store_true",
                   help="transformers must load the export with tied embeddings (lm_head is "
                        "embed_tokens' weight)")
    args = p.parse_args()
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        print(f"skipped: this check needs transformers (and torch) in python3 ({e}); "
              "pip install torch transformers safetensors")
        return SKIP
    with tempfile.TemporaryDirectory() as work:
        ckpt = train(args, work)
        out = run([args.fsdp_ckpt, "generate", ckpt, "--prompt", PROMPT, "--max-new-tokens",
                   str(NEW), "--ids"])
        ours = [int(x) for x in out.split()]
        text = subprocess.run([args.fsdp_ckpt, "generate", ckpt, "--prompt", PROMPT,
                               "--max-new-tokens", str(NEW)], stdout=subprocess.PIPE,
                              check=True).stdout
        hf = os.path.join(work, "hf")
        run([args.fsdp_ckpt, "export", "--format", "hf", ckpt, "--out", hf])
        tok = AutoTokenizer.from_pretrained(hf)
        encoded, decoded = tok(PROMPT)["input_ids"], tok.decode(ours).encode()
        tok_ok = encoded == list(PROMPT.encode()) and decoded + b"\n" == text
        print(f"tokenizer: the prompt as {encoded}, libfsdp's tokens as {decoded!r} "
              f"({'ok' if tok_ok else 'FAILED'}: generate printed {text!r})", flush=True)
        if not tok_ok:
            print("FAILED")
            return 1
        try:
            import torch
            from transformers import LlamaForCausalLM
            import safetensors  # noqa: F401
        except ImportError as e:
            print(f"skipped: the rest of this check needs torch, transformers and safetensors in "
                  f"python3 ({e}); pip install torch transformers safetensors")
            return SKIP
        torch.set_num_threads(1)
        model = LlamaForCausalLM.from_pretrained(hf, attn_implementation="eager")
        model = model.to(torch.float32).eval()
        rope = model.config.rope_parameters or {}
        hd = model.config.hidden_size // model.config.num_attention_heads
        plain = 1.0 / (rope.get("rope_theta", 10000.0)
                       ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        scaled = not torch.equal(model.model.rotary_emb.inv_freq, plain)
        rope_ok = rope.get("rope_type") == args.rope_type and scaled == (args.rope_type != "default")
        print(f"rope: transformers reads rope_type {rope.get('rope_type')!r} (want "
              f"{args.rope_type!r}), its frequencies {'scaled' if scaled else 'unscaled'} "
              f"({'ok' if rope_ok else 'FAILED'})", flush=True)
        if not rope_ok:
            print("FAILED")
            return 1
        tied = model.lm_head.weight is model.model.embed_tokens.weight
        tie_ok = tied == args.tied and bool(model.config.tie_word_embeddings) == args.tied
        print(f"tie: tie_word_embeddings {model.config.tie_word_embeddings}, lm_head "
              f"{'is' if tied else 'is not'} the embedding's weight "
              f"({'ok' if tie_ok else 'FAILED'})", flush=True)
        if not tie_ok:
            print("FAILED")
            return 1
        prompt = torch.tensor([list(PROMPT.encode())])
        # no end-of-sequence token: the byte model has none, and generate must not stop early
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        with torch.no_grad():
            gen = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                 max_new_tokens=NEW, do_sample=False, num_beams=1)
            theirs = gen[0, prompt.shape[1]:].tolist()
            logits = model(torch.tensor([list(PROMPT.encode()) + ours])).logits[0]
        print(f"libfsdp:      {ours}\ntransformers: {theirs}", flush=True)
        ok = len(ours) == NEW and len(theirs) == NEW
        for i in range(min(len(ours), len(theirs))):
            row = logits[len(PROMPT) - 1 + i]
            gap = float(row.max() - row[ours[i]]) / float(row.abs().max())
            if ours[i] != theirs[i] or gap > 0:
                tie = gap <= RTOL
                print(f"step {i}: libfsdp {ours[i]}, transformers {theirs[i]}, argmax "
                      f"{int(row.argmax())}, gap {gap:.3g} of the largest logit "
                      f"({'a tie within' if tie else 'MORE than'} rtol {RTOL:g})", flush=True)
                ok = ok and tie
                if ours[i] != theirs[i]:
                    break  # the sequences part here; the rest continue other prompts
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
