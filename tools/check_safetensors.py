#!/usr/bin/env python3
"""Load a `fsdp-ckpt export --out FILE.safetensors` file with safetensors into torch and print
each tensor's name, shape and dtype (and the metadata). Optional and run by hand: libfsdp never
needs safetensors or torch.

    python3 -m venv .venv && .venv/bin/pip install safetensors torch
    fsdp-ckpt export CHECKPOINT --out model.safetensors
    .venv/bin/python tools/check_safetensors.py model.safetensors [--h5 model.h5]

With --h5 (needs h5py and numpy) it also checks that an .h5 export of the same checkpoint
holds the same values, tensor by tensor (bf16 datasets are uint16 with attribute dtype=bf16).
"""

import argparse
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="a .safetensors file written by fsdp-ckpt export")
    ap.add_argument("--h5", help="an .h5 export of the same checkpoint to compare with")
    args = ap.parse_args()

    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(args.file, framework="pt") as f:
        print("metadata:", f.metadata())
    tensors = load_file(args.file)
    for name, t in tensors.items():
        print(f"{name:40s} {tuple(t.shape)!s:16s} {t.dtype}")
    print(f"{len(tensors)} tensors")

    if args.h5:
        import h5py
        import numpy as np
        import torch

        bad = 0
        with h5py.File(args.h5, "r") as h:
            for name, t in tensors.items():
                ds = h[name]
                v = ds[()]
                if ds.attrs.get("dtype") in (b"bf16", "bf16"):
                    want = t.view(torch.int16).numpy().view(np.uint16)
                else:
                    want = t.numpy()
                if v.shape != want.shape or not np.array_equal(v, want):
                    print(f"{name}: the .h5 export differs", file=sys.stderr)
                    bad += 1
        print("h5 export matches" if not bad else f"{bad} tensors differ")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
