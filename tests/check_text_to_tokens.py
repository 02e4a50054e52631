#!/usr/bin/env python3
"""check_text_to_tokens.py: tools/text_to_tokens.py with a Hugging Face tokenizer.json and as an
llm.c .bin shard, read by fsdp-train.

A word-level tokenizer (tokenizers' WordLevel model, whitespace pre-tokenizer, 40 words and
[UNK]) is built and saved here; text_to_tokens.py --tokenizer that.json must write exactly
Tokenizer.encode(text, add_special_tokens=False).ids with the tokenizer's vocabulary in the
token file's header, and --format bin the same ids under llm.c's header (256 int32: 20240520,
1, count); the byte tokenizer's --format bin likewise. fsdp-train then trains a tiny Llama for
4 steps on the token file and on the .bin: the metrics (losses, learning rate, gradient norm)
must be bitwise equal. A missing tokenizer file is refused. Exits 77 (skipped) without the
tokenizers package.

    python3 tests/check_text_to_tokens.py --fsdp-train build/fsdp-train
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "tools", "text_to_tokens.py")
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "her", "house",
         "in", "rain", "of", "june", "with", "some", "tea", "at", "noon", "by", "old", "river",
         "she", "he", "saw", "new", "boat", "red", "sun", "we", "read", "long", "book", "quiet",
         "room", "after", "dinner", "."]


def run(*args):
    return subprocess.run([*args], capture_output=True, text=True, timeout=300)


def read_tok(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, width, count, vocab = struct.unpack("<8sIIQQ", data[:32])
    fmt = {2: "H", 4: "I"}[width]
    return (magic, version, count, vocab), list(struct.unpack(f"<{count}{fmt}", data[32:]))


def read_bin(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    width = 2 if header[0] == 20240520 else 4
    count = (len(data) - 1024) // width
    return header, list(struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", data[1024:]))


def train(exe, path, vocab, workdir, name):
    metrics = os.path.join(workdir, f"{name}.jsonl")
    sets = ["model.dim=32", "model.n_layers=2", "model.n_heads=4",
            "model.n_kv_heads=2", "model.ffn_hidden=64", "model.max_seq_len=16",
            f"model.vocab_size={vocab}", "data.kind=tokens", f"data.path={path}",
            "data.batch_size=4", "data.eval_fraction=0", "optim.name=sgd", "optim.lr=0.5",
            "optim.clip_grad_norm=1", "train.steps=4", "train.log_every=1", "log.progress=lines",
            f"log.metrics={metrics}", "parallel.ranks=1", "parallel.backend=local"]
    ini = os.path.join(workdir, "run.ini")
    with open(ini, "w") as f:
        f.write("[model]\nkind = llama\n")
    r = run(exe, "--config", ini, *[a for s in sets for a in ("--set", s)])
    if r.returncode != 0:
        raise RuntimeError(f"fsdp-train on {path}: exit {r.returncode}: {r.stderr}")
    with open(metrics) as f:
        recs = [json.loads(line) for line in f]
    keep = ("step", "loss", "lr", "grad_norm")
    return [{k: r[k] for k in keep if k in r} for r in recs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fsdp-train", required=True, help="the fsdp-train executable")
    args = ap.parse_args()
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:
        print("check_text_to_tokens.py: skipped: the tokenizers package is missing "
              "(pip install tokenizers)")
        return 77
    failures = []
    with tempfile.TemporaryDirectory() as d:
        vocab = {w: i for i, w in enumerate(["[UNK]"] + WORDS)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tj = os.path.join(d, "tokenizer.json")
        tok.save(tj)
        rng = random.Random(7)
        text = " ".join(rng.choice(WORDS + ["zebra"]) for _ in range(3000))
        src = os.path.join(d, "text.txt")
        with open(src, "w") as f:
            f.write(text)
        want = Tokenizer.from_file(tj).encode(text, add_special_tokens=False).ids
        n_vocab = len(vocab)

        outs = {}
        for fmt in ("tok", "bin"):
            outs[fmt] = os.path.join(d, f"hf.{fmt}")
            r = run(sys.executable, TOOL, src, "-o", outs[fmt], "--tokenizer", tj, "--format", fmt)
            print(r.stdout.strip() or r.stderr.strip())
            if r.returncode != 0:
                failures.append(f"--format {fmt}: exit {r.returncode}: {r.stderr}")
        head, ids = read_tok(outs["tok"])
        if head != (b"FSDPTOK\0", 1, len(want), n_vocab) or ids != want:
            failures.append(f"token file: header {head}, {len(ids)} ids; want {len(want)} ids "
                            f"of vocab {n_vocab}")
        if 0 not in ids:
            failures.append("the unknown word did not map to [UNK] (id 0)")
        header, ids = read_bin(outs["bin"])
        if header[:3] != (20240520, 1, len(want)) or any(header[3:]) or ids != want:
            failures.append(f".bin: header {header[:4]}, {len(ids)} ids; want {len(want)}")
        # the byte tokenizer as .bin
        bb = os.path.join(d, "bytes.bin")
        r = run(sys.executable, TOOL, src, "-o", bb, "--format", "bin")
        header, ids = read_bin(bb)
        if r.returncode != 0 or header[:3] != (20240520, 1, len(text)) or ids != list(
                text.encode()):
            failures.append(f"byte tokenizer .bin: exit {r.returncode}, header {header[:3]}")
        # refusals
        r = run(sys.executable, TOOL, src, "-o", os.path.join(d, "x.tok"), "--tokenizer",
                os.path.join(d, "missing.json"))
        if r.returncode == 0 or "no such file" not in r.stderr:
            failures.append(f"a missing tokenizer: exit {r.returncode}: {r.stderr}")
        r = run(sys.executable, TOOL, src, "-o", os.path.join(d, "x.bin"), "--format", "bin",
                "--dtype", "uint32")
        if r.returncode == 0 or "--dtype applies to --format tok" not in r.stderr:
            failures.append(f"--dtype with bin: exit {r.returncode}: {r.stderr}")
        # fsdp-train on both: bitwise the same metrics
        try:
            a = train(args.fsdp_train, outs["tok"], n_vocab, d, "tok")
            b = train(args.fsdp_train, outs["bin"], n_vocab, d, "bin")
            if a != b or len(a) != 4:
                failures.append(f"fsdp-train: token file {a} != .bin {b}")
            else:
                print(f"fsdp-train: 4 steps on the token file and the .bin, losses "
                      f"{a[0]['loss']} .. {a[-1]['loss']}: bitwise equal")
        except RuntimeError as e:
            failures.append(str(e))
    for f in failures:
        print(f"FAIL: {f}")
    print(f"check_text_to_tokens.py: {'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
