#!/usr/bin/env python3
"""Generate the state dicts that tests/test_ckpt_import.c imports, made by PyTorch.

Writes into tests/fixtures/ (committed, so building and testing libfsdp never needs PyTorch,
safetensors or h5py):

    import_mlp.safetensors  MLPStacked(2)'s state_dict(), safetensors.torch.save_file
    import_mlp.h5           the same values with h5py: layers.0.* as datasets named by their
                            state_dict keys at the root, layers.1.* in nested groups
                            (layers/1/net1/weight), so the reader's two namings are both used
    import_dtypes.safetensors  tensors of F64, F16, BF16 and F32 (a 0-d one)
    import_dtypes.h5        F64 and F16 datasets, and BF16 as uint16 with attribute dtype=bf16
    import_batch.safetensors  the batch x, y below, the data file of examples/finetune_ckpt
    train_mlp.safetensors   nn.Sequential(Linear(8, 16), ReLU, Linear(16, 16), ReLU,
                            Linear(16, 4))'s state_dict() (0.weight, 0.bias, 2.weight, ...):
                            the MLP fsdp-train builds for widths 8,16,16,4, which
                            tests/test_train.c starts from ([model] init)
    train_mlp.h5            the same values with h5py, datasets named by the state_dict keys
    import_mlp.bin          (tests/fixtures/README.md format) the references:
        x, y            a fixed batch (12, 10) and its regression target
        out             the model's output for x, before training
        sgd.<param>     the parameters after 3 steps of SGD(lr=1e-2, momentum=0.9) on
                        MSELoss(model(x), y), the same batch every step
        adam.<param>    the same with Adam(lr=1e-2)
        dt.<name>       each import_dtypes tensor as float32 (what import converts it to)

The model, optimizers and batch size are those of tests/ckpt_common.c. Run from the
repository root (needs torch, safetensors, h5py and numpy), then commit the files:

    python3 tools/gen_import_fixture.py [--out DIR]
"""

import argparse
import os
import sys


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "tests", "fixtures")))
    return ap.parse_args()


# The command line is read before the imports of torch and h5py (seconds), which --help and a
# bad option need not wait for.
ARGS = parse_args() if __name__ == "__main__" else None

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import MLPStacked, write_fixture  # noqa: E402

STEPS = 3
LR = 1e-2
BATCH, DIM = 12, 10


def train(model, opt, x, y):
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def dtype_tensors():
    """Values that test each conversion: rounding (F64), subnormals and infinities (F16)."""
    return {
        "a.f64": torch.tensor([[0.1, -2.5, 1e-30], [3.0e38, -1e-45, 7.0]], dtype=torch.float64),
        "b.f16": torch.tensor([1.0, -0.333, 6.0e-8, 65504.0, float("-inf"), 0.0],
                              dtype=torch.float16),
        "c.bf16": torch.tensor([[1.5, -3.25e20], [1e-20, 0.0078125]], dtype=torch.bfloat16),
        "d.f32": torch.tensor(-0.75, dtype=torch.float32),
    }


def train_mlp(out):
    """fsdp-train's MLP for widths 8,16,16,4, as PyTorch names it."""
    torch.manual_seed(1515)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 4))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(out, "train_mlp.safetensors"))
    with h5py.File(os.path.join(out, "train_mlp.h5"), "w") as f:
        for k, v in state.items():
            f[k] = v.numpy()


def main(args):
    train_mlp(args.out)
    torch.manual_seed(1414)
    model = MLPStacked(2)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.rand(BATCH, DIM) * 2 - 1
    y = torch.rand(BATCH, DIM) * 2 - 1
    with torch.no_grad():
        out = model(x)

    save_file(start, os.path.join(args.out, "import_mlp.safetensors"))
    with h5py.File(os.path.join(args.out, "import_mlp.h5"), "w") as f:
        for k, v in start.items():
            f[k if k.startswith("layers.0.") else k.replace(".", "/")] = v.numpy()

    save_file({"x": x, "y": y}, os.path.join(args.out, "import_batch.safetensors"))
    refs = [("x", x), ("y", y), ("out", out)]
    for name, make in (("sgd", lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9)),
                       ("adam", lambda p: torch.optim.Adam(p, lr=LR))):
        m = MLPStacked(2)
        m.load_state_dict(start)
        after = train(m, make(m.parameters()), x, y)
        refs += [(f"{name}.{k}", v) for k, v in after.items()]

    dts = dtype_tensors()
    save_file(dts, os.path.join(args.out, "import_dtypes.safetensors"))
    with h5py.File(os.path.join(args.out, "import_dtypes.h5"), "w") as f:
        for k, v in dts.items():
            if v.dtype == torch.bfloat16:
                f[k] = v.view(torch.int16).numpy().view(np.uint16)
                f[k].attrs["dtype"] = "bf16"
            else:
                f[k] = v.numpy()
    with np.errstate(over="ignore"):
        refs += [(f"dt.{k}", v.to(torch.float32)) for k, v in dts.items()]
    n = write_fixture(os.path.join(args.out, "import_mlp.bin"), refs)
    print(f"wrote import_mlp.*, import_dtypes.*, import_batch.safetensors, train_mlp.* ({n} bytes "
          "of references)")


if __name__ == "__main__":
    main(ARGS)
