#!/usr/bin/env python3
"""make_austen.py: writes examples/data/austen-pride.tok, the token file of examples/llama-austen.ini.

The text is Jane Austen's "Pride and Prejudice" (1813, in the public domain) as Debian's package
r-cran-janeaustenr ships it (Julia Silge's janeaustenr, MIT license; the novels' text from
Project Gutenberg). The package keeps each novel as an R character vector, one line of the book
per element, in R's lazy-load database data/Rdata.rdb (index data/Rdata.rdx): this script reads
that format itself, so R is not needed, only the package's files:

    apt-get download r-cran-janeaustenr && dpkg -x r-cran-janeaustenr_*.deb pkg
    python3 examples/make_austen.py --package pkg/usr/lib/R/site-library/janeaustenr

(or `apt-get install r-cran-janeaustenr`, then no --package). The lines are joined with
newlines and tokenized byte by byte (tools/text_to_tokens.py; vocab 256). Standard library only.
"""
import argparse
import gzip
import os
import struct
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import text_to_tokens  # noqa: E402

DEFAULT_PACKAGE = "/usr/lib/R/site-library/janeaustenr"
NOVELS = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice",
          "sensesensibility"]


class RReader:
    """Just enough of R's serialization format (XDR, version 2 or 3) for the index (a named list
    of integer pairs) and a character vector."""

    def __init__(self, data):
        if data[:2] != b"X\n":
            raise ValueError("not an R XDR serialization")
        self.d, self.p = data, 2
        version = self.int()
        self.int(), self.int()  # the writer's and the minimal reader's R versions
        if version == 3:
            n = self.int()  # the native encoding's name
            self.p += n

    def int(self):
        (v,) = struct.unpack(">i", self.d[self.p:self.p + 4])
        self.p += 4
        return v

    def chars(self):
        flags, n = self.int(), self.int()
        if flags & 0xFF != 9:
            raise ValueError(f"expected a CHARSXP, found type {flags & 0xFF}")
        if n < 0:
            return None  # NA
        s = self.d[self.p:self.p + n].decode("utf-8")
        self.p += n
        return s

    def strings(self):
        flags = self.int()
        if flags & 0xFF != 16:
            raise ValueError(f"expected a character vector (STRSXP), found type {flags & 0xFF}")
        return [self.chars() for _ in range(self.int())]

    def offsets(self):
        """The index's 'variables' entry: name -> (offset, length) in Rdata.rdb. The entries are
        integer pairs in the order of their names, which follow as the list's attribute."""
        if self.int() & 0xFF != 19:  # VECSXP: list(variables, references, compressed)
            raise ValueError("the index is not a list")
        self.int()  # its length
        flags = self.int()
        if flags & 0xFF != 19:
            raise ValueError("the index's variables are not a list")
        pairs = []
        for _ in range(self.int()):
            if self.int() & 0xFF != 13 or self.int() != 2:  # INTSXP of length 2
                raise ValueError("an index entry is not an integer pair")
            pairs.append((self.int(), self.int()))
        if self.int() & 0xFF != 2 or self.int() & 0xFF != 1:  # attributes: LISTSXP, SYMSXP
            raise ValueError("the index's variables have no names")
        if self.chars() != "names":
            raise ValueError("the index's variables have no names")
        return dict(zip(self.strings(), pairs))


def read_novel(package, name):
    index = gzip.decompress(open(os.path.join(package, "data", "Rdata.rdx"), "rb").read())
    where = RReader(index).offsets()
    if name not in where:
        sys.exit(f"make_austen.py: the package's index has no '{name}'")
    off, length = where[name]
    with open(os.path.join(package, "data", "Rdata.rdb"), "rb") as f:
        f.seek(off)
        blob = f.read(length)
    (size,) = struct.unpack(">I", blob[:4])  # then zlib
    data = zlib.decompress(blob[4:])
    if len(data) != size:
        sys.exit(f"make_austen.py: '{name}' decompressed to {len(data)} bytes, not {size}")
    return [line if line is not None else "" for line in RReader(data).strings()]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default=DEFAULT_PACKAGE,
                    help=f"the janeaustenr package directory (default {DEFAULT_PACKAGE})")
    ap.add_argument("--novel", default="prideprejudice", choices=NOVELS)
    ap.add_argument("-o", "--output", default=os.path.join(here, "data", "austen-pride.tok"))
    args = ap.parse_args()
    if not os.path.isdir(args.package):
        sys.exit(f"make_austen.py: no janeaustenr package at {args.package}: apt-get install "
                 "r-cran-janeaustenr, or apt-get download it, dpkg -x it and pass --package")
    text = "\n".join(read_novel(args.package, args.novel)) + "\n"
    ids, vocab = text_to_tokens.encode(text, "byte")
    dtype = text_to_tokens.write_tokens(args.output, ids, vocab)
    h = text_to_tokens.unigram_entropy(ids)
    print(f"{args.output}: {args.novel}, {len(text)} characters, {len(ids)} tokens ({dtype}), "
          f"vocab {vocab}; unigram entropy {h:.4f} nats/token")


if __name__ == "__main__":
    main()
