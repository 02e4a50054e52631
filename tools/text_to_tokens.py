#!/usr/bin/env python3
"""text_to_tokens.py: text -> an fsdp-train token file ([data] kind = tokens).

Byte-level by default: every byte of the UTF-8 text is one token id in [0, 256), so a model
with [model] vocab_size = 256 can read any text. With --tokenizer gpt2, GPT-2's BPE through
tiktoken (pip install tiktoken; vocab_size 50257). With --tokenizer PATH/tokenizer.json, a
Hugging Face `tokenizers` tokenizer (pip install tokenizers; the file a model directory ships,
e.g. a Llama's), without its special tokens; the vocabulary is its size with added tokens.

--format tok (default) writes fsdp-train's token file (docs/train.md, "Token files"): a
32-byte little-endian header, then the ids.
    bytes  0..7   magic b"FSDPTOK\\0"
    bytes  8..11  version, u32: 1
    bytes 12..15  bytes per id, u32: 2 (uint16) or 4 (uint32)
    bytes 16..23  count, u64: the number of ids that follow
    bytes 24..31  vocab, u64: the tokenizer's vocabulary size (every id is below it)
--format bin writes an llm.c .bin shard instead, which fsdp-train reads too: 256 int32
(magic 20240520, version 1, count) then uint16 ids; a vocabulary over 65536 ids uses llm.c's
Llama 3 magic 20240801 with uint32 ids. The shard states no vocabulary.

Standard library only for the byte tokenizer. Prints the count, the vocabulary and the unigram
entropy of the tokens (nats per token: the loss of a model that knows only their frequencies).

    python3 tools/text_to_tokens.py book.txt -o book.tok
    python3 tools/text_to_tokens.py a.txt b.txt -o ab.tok --tokenizer gpt2
    python3 tools/text_to_tokens.py book.txt -o book.bin --format bin \\
        --tokenizer llama/tokenizer.json
"""
import argparse
import math
import os
import struct
import sys
from array import array
from collections import Counter

MAGIC = b"FSDPTOK\0"
VERSION = 1
LLMC_MAGIC_U16, LLMC_MAGIC_U32, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 20240801, 1, 256


def encode(text, tokenizer):
    """Token ids of text and the tokenizer's vocabulary size."""
    if tokenizer == "byte":
        return list(text.encode("utf-8")), 256
    if tokenizer == "gpt2":
        return encode_gpt2(text)
    return encode_hf(text, tokenizer)


def encode_gpt2(text):
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


def encode_hf(text, path):
    """A Hugging Face tokenizers tokenizer.json: ids without special tokens."""
    if not os.path.isfile(path):
        sys.exit(f"text_to_tokens.py: --tokenizer {path}: no such file; give byte, gpt2 or "
                 "the path of a Hugging Face tokenizer.json")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit(f"text_to_tokens.py: --tokenizer {path} needs the tokenizers package "
                 "(pip install tokenizers)")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception for a bad file
        sys.exit(f"text_to_tokens.py: {path} is not a tokenizers tokenizer.json ({e}); give "
                 "the tokenizer.json of a Hugging Face model directory")
    ids = tok.encode(text, add_special_tokens=False).ids
    return ids, tok.get_vocab_size(with_added_tokens=True)


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


def write_llmc(path, ids, vocab):
    """Writes ids as an llm.c .bin shard: uint16 ids (magic 20240520) when vocab fits, else
    uint32 (20240801). Returns the id type."""
    if ids and max(ids) >= vocab:
        raise ValueError(f"token id {max(ids)} is not below the vocabulary {vocab}")
    if len(ids) > 2**31 - 1:
        raise ValueError(f"{len(ids)} tokens do not fit an llm.c shard's int32 count; split "
                         "the text into several shards (fsdp-train reads a glob of them)")
    u16 = vocab <= 65536
    header = array("i", [0] * LLMC_HEADER_INTS)
    header[0:3] = array("i", [LLMC_MAGIC_U16 if u16 else LLMC_MAGIC_U32, LLMC_VERSION, len(ids)])
    body = array("H" if u16 else "I", ids)
    if sys.byteorder != "little":
        header.byteswap()
        body.byteswap()
    with open(path, "wb") as f:
        header.tofile(f)
        body.tofile(f)
    return "uint16" if u16 else "uint32"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="UTF-8 text files, concatenated in this order")
    ap.add_argument("-o", "--output", required=True, help="the token file to write")
    ap.add_argument("--tokenizer", default="byte",
                    help="byte: UTF-8 bytes, vocab 256 (default); gpt2: GPT-2 BPE via tiktoken; "
                         "or the path of a Hugging Face tokenizer.json (pip install tokenizers)")
    ap.add_argument("--dtype", choices=["auto", "uint16", "uint32"], default="auto",
                    help="id size in a token file (auto: uint16 when the vocabulary fits)")
    ap.add_argument("--format", choices=["tok", "bin"], default="tok",
                    help="tok: fsdp-train's token file (default); bin: an llm.c .bin shard")
    args = ap.parse_args()
    text = "".join(open(p, encoding="utf-8").read() for p in args.inputs)
    ids, vocab = encode(text, args.tokenizer)
    if not ids:
        sys.exit("text_to_tokens.py: the input holds no text")
    if args.format == "bin":
        if args.dtype != "auto":
            ap.error("--dtype applies to --format tok; an llm.c shard's id type follows the "
                     "vocabulary")
        dtype = write_llmc(args.output, ids, vocab)
    else:
        dtype = write_tokens(args.output, ids, vocab, args.dtype)
    h = unigram_entropy(ids)
    kind = "llm.c shard, " if args.format == "bin" else ""
    print(f"{args.output}: {len(ids)} tokens ({kind}{dtype}), {args.tokenizer} tokenizer, "
          f"vocab {vocab}, {len(set(ids))} distinct; unigram entropy {h:.4f} nats/token "
          f"(perplexity {math.exp(h):.2f})")


if __name__ == "__main__":
    main()
