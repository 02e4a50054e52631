#!/usr/bin/env python3
"""Load a `fsdp-ckpt export --out FILE.safetensors` file with safetensors into torch and print
each tensor's name, shape and dtype (and the metadata). Optional and run by hand: libfsdp never
needs safetensors or torch.

    python3 -m venv .venv && .venv/bin/pip install safetensors torch
    fsdp-ckpt export CHECKPOINT --out model.safetensors
    .venv/bin/python tools/check_safetensors.py model.safetensors [--h5 model.h5]
                                                [--mlp-stacked 2]

With --h5 (needs h5py and numpy) it also checks that an .h5 export of the same checkpoint
holds the same values, tensor by tensor (bf16 datasets are uint16 with attribute dtype=bf16).
With --mlp-stacked N it loads the file into a PyTorch MLPStacked(N) (libfsdp's
fsdp_model_mlp_stacked, tools/gen_fixtures.py) with load_state_dict(strict=True) and prints
the model's output for a seeded input; tools/check_torch_roundtrip.py uses load_model to
compare a model trained by libfsdp with one trained by torch.
"""

import argparse
import sys


def load_model(path, model):
    """Loads the safetensors file at path into model (strict: every key, every shape)."""
    from safetensors.torch import load_file

    model.load_state_dict(load_file(path), strict=True)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="a .safetensors file written by fsdp-ckpt export")
    ap.add_argument("--h5", help="an .h5 export of the same checkpoint to compare with")
    ap.add_argument("--mlp-stacked", type=int, metavar="N",
                    help="load the file into MLPStacked(N) and run it on a seeded input")
    args = ap.parse_args()

    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(args.file, framework="pt") as f:
        print("metadata:", f.metadata())
    tensors = load_file(args.file)
    for name, t in tensors.items():
        print(f"{name:40s} {tuple(t.shape)!s:16s} {t.dtype}")
    print(f"{len(tensors)} tensors")

    bad = 0
    if args.h5:
        import h5py
        import numpy as np
        import torch

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
    if args.mlp_stacked:
        import os

        import torch

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gen_fixtures import MLPStacked

        model = load_model(args.file, MLPStacked(args.mlp_stacked))
        torch.manual_seed(0)
        x = torch.rand(4, 10) * 2 - 1
        with torch.no_grad():
            print("MLPStacked output for torch.manual_seed(0); x = torch.rand(4, 10) * 2 - 1:")
            print(model(x))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
