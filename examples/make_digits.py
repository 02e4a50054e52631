#!/usr/bin/env python3
"""Writes examples/data/digits.h5 for examples/digits.ini from scikit-learn's bundled digits
(1,797 8x8 images of handwritten digits, 10 classes; no download).

  x  float32 (1797, 64)  pixel intensities scaled from 0..16 to [0, 1]
  y  int32   (1797,)     class ids 0..9

The samples are shuffled once with a fixed seed, so that the held-out split fsdp-train takes
(the last [data] eval_fraction of the samples in file order) is a random sample of writers
and classes. Run once (needs numpy, h5py, scikit-learn); the output is committed:

  python3 examples/make_digits.py [OUT]
"""
import os
import sys

import h5py
import numpy as np
from sklearn.datasets import load_digits


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "data", "digits.h5")
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with h5py.File(out, "w") as f:
        f.create_dataset("x", data=x)
        f.create_dataset("y", data=y)
        f.attrs["source"] = "sklearn.datasets.load_digits, shuffled with numpy default_rng(0)"
    print(f"{out}: x {x.shape} {x.dtype}, y {y.shape} {y.dtype}, classes {np.bincount(y).tolist()}")


if __name__ == "__main__":
    main()
