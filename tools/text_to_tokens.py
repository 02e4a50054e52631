#!/usr/bin/env python3
"""text_to_tokens.py: text -> an fsdp-train token file ([data] kind = tokens).

Byte-level by default: every byte of the UTF-8 text is one token id in [0, 256), so a model
with [model] vocab_size = 256 can read any text. With --tokenizer gpt2, GPT-2's BPE through
tiktoken (pip install tiktoken; vocab_size 50257).

The token file (docs/train.md, "Token files"): a 32-byte little-endian header, then the ids.
    bytes  0..7   magic b"FSDPTOK\\0"
    bytes  8..11  version, u32: 1
    bytes 12..15  bytes per id, u32: 2 (uint16) or 4 (uint32)
    bytes 16..23  count, u64: the number of ids that follow
    bytes 24..31  vocab, u64: the tokenizer's vocabulary size (every id is below it)

Standard library only for the byte tokenizer. Prints the count, the vocabulary and the unigram
entropy of the tokens (nats per token: the loss of a model that knows only their frequencies).

    python3 tools/text_to_tokens.py book.txt -o book.tok
    python3 tools/text_to_tokens.py a.txt b.txt -o ab.tok --tokenizer gpt2
"""
import argparse
import math
import struct
import sys
from array import array
from collections import Counter

MAGIC = b"FSDPTOK\0"
VERSION = 1


def encode(text, tokenizer):
    """Token ids of text and the tokenizer's vocabulary size."""
    if tokenizer == "byte":
        return list(text.encode("utf-8")), 256
    try:
        import tiktoken
    except ImportError:
        sys.exit("text_to_tokens.py: --tokenizer gpt2 needs tiktoken (pip install tiktoken); "
                 "or use the byte tokenizer (the default)")
    try:
        enc = tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken fetches the BPE tables once, then reads its cache
        sys.exit(f"text_to_tokens.py: tiktoken could not load GPT-2's encoding ({e}); it "
                 "downloads it on first use (or set TIKTOKEN_CACHE_DIR to a cache that has it)")
    return enc.encode_ordinary(text), enc.n_vocab


def unigram_entropy(ids):
    """-sum p log p over the ids' frequencies, in nats."""
    n = len(ids)
    return -sum(c / n * math.log(c / n) for c in Counter(ids).values()) if n else 0.0


def write_tokens(path, ids, vocab, dtype="auto"):
    """Writes ids as a token file; dtype uint16, uint32 or auto (uint16 when vocab fits)."""
    if dtype == "auto":
        dtype = "uint16" if vocab <= 65536 else "uint32"
    bytes_per_id = 2 if dtype == "uint16" else 4
    if ids and max(ids) >= vocab:
        raise ValueError(f"token id {max(ids)} is not below the vocabulary {vocab}")
    if bytes_per_id == 2 and vocab > 65536:
        raise ValueError(f"a vocabulary of {vocab} ids does not fit uint16; use --dtype uint32")
    body = array("H" if bytes_per_id == 2 else "I", ids)
    assert body.itemsize == bytes_per_id
    if sys.byteorder != "little":
        body.byteswap()
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<IIQQ", VERSION, bytes_per_id, len(ids), vocab))
        body.tofile(f)
    return dtype


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="UTF-8 text files, concatenated in this order")
    ap.add_argument("-o", "--output", required=True, help="the token file to write")
    ap.add_argument("--tokenizer", choices=["byte", "gpt2"], default="byte",
                    help="byte: UTF-8 bytes, vocab 256 (default); gpt2: GPT-2 BPE via tiktoken")
    ap.add_argument("--dtype", choices=["auto", "uint16", "uint32"], default="auto",
                    help="id size in the file (auto: uint16 when the vocabulary fits)")
    args = ap.parse_args()
    text = "".join(open(p, encoding="utf-8").read() for p in args.inputs)
    ids, vocab = encode(text, args.tokenizer)
    if not ids:
        sys.exit("text_to_tokens.py: the input holds no text")
    dtype = write_tokens(args.output, ids, vocab, args.dtype)
    h = unigram_entropy(ids)
    print(f"{args.output}: {len(ids)} tokens ({dtype}), {args.tokenizer} tokenizer, vocab {vocab}, "
          f"{len(set(ids))} distinct; unigram entropy {h:.4f} nats/token "
          f"(perplexity {math.exp(h):.2f})")


if __name__ == "__main__":
    main()
