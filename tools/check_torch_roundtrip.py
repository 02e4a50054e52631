#!/usr/bin/env python3
"""A PyTorch model imported into libfsdp, trained there, exported and read back by PyTorch,
against PyTorch's own training of the same steps on the same data. Optional and run by hand
(CI never runs it: torch is not a dependency of libfsdp). From the repository root, after
building (the default build directory is build/):

    pip install torch safetensors h5py numpy
    python3 tools/check_torch_roundtrip.py [--build build] [--steps 10] [--layout 2x2]

1. torch makes MLPStacked(2) (tools/gen_fixtures.py) and saves its state_dict with
   safetensors (model.safetensors), and a batch x, y (16, 10) with h5py (data.h5);
2. `fsdp-ckpt import model.safetensors --out init` makes the checkpoint init/step-00000000;
3. examples/finetune_ckpt trains it: MSE loss, SGD(lr, momentum) for --steps steps on the whole
   batch, at --layout 1x1 or 2x2 (dp 2 x tp 2, FSDP), saving run/step-<steps>;
4. `fsdp-ckpt export run --out trained.safetensors`;
5. torch loads trained.safetensors into MLPStacked(2) (strict, tools/check_safetensors.py's
   load_model) and compares it with a copy of the first model trained by torch the same way:
   every parameter, and the outputs of both on x.

Prints the max absolute and relative difference per tensor; exits 1 when one is over
--rtol (default 1e-4) relative to the tensor's largest magnitude.
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--layout", default="2x2", choices=["1x1", "2x2"])
    ap.add_argument("--rtol", type=float, default=1e-4)
    return ap.parse_args()


# The command line is read before the imports of torch and h5py (seconds), which --help and a
# bad option need not wait for.
ARGS = parse_args() if __name__ == "__main__" else None

import h5py  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, HERE)
from check_safetensors import load_model  # noqa: E402
from gen_fixtures import MLPStacked  # noqa: E402


def run(cmd):
    print("$", " ".join(cmd))
    out = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}")
    return out.stdout


def diff(name, got, want):
    d = (got - want).abs().max().item()
    scale = want.abs().max().item()
    rel = d / scale if scale else d
    print(f"{name:24s} max abs diff {d:.3e}  relative to max |value| {rel:.3e}")
    return rel


def main(args):
    tool = os.path.join(args.build, "fsdp-ckpt")
    finetune = os.path.join(args.build, "finetune_ckpt")
    for exe in (tool, finetune):
        if not os.access(exe, os.X_OK):
            sys.exit(f"{exe} not found: build first, or pass --build DIR")

    torch.manual_seed(2024)
    model = MLPStacked(2)
    x = torch.randn(16, 10)
    y = torch.sin(x) * 0.5
    with tempfile.TemporaryDirectory() as tmp:
        save_file(model.state_dict(), os.path.join(tmp, "model.safetensors"))
        with h5py.File(os.path.join(tmp, "data.h5"), "w") as f:
            f["x"] = x.numpy()
            f["y"] = y.numpy()
        run([tool, "import", os.path.join(tmp, "model.safetensors"), "--out", f"{tmp}/init"])
        run([finetune, f"{tmp}/init/step-00000000", f"{tmp}/data.h5", f"{tmp}/run",
             "--steps", str(args.steps), "--lr", str(args.lr), "--momentum", str(args.momentum),
             "--layout", args.layout])
        run([tool, "export", f"{tmp}/run", "--out", f"{tmp}/trained.safetensors"])
        ours = load_model(f"{tmp}/trained.safetensors", MLPStacked(2))

    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        print(f"torch step {step:3d}  loss {loss.item():.7f}")

    print(f"\nlibfsdp ({args.layout}) against torch after {args.steps} SGD steps:")
    worst = 0.0
    theirs = model.state_dict()
    for k, v in ours.state_dict().items():
        worst = max(worst, diff(k, v, theirs[k]))
    with torch.no_grad():
        worst = max(worst, diff("output on x", ours(x), model(x)))
    ok = worst <= args.rtol
    print(f"\nworst relative difference {worst:.3e}: {'ok' if ok else 'TOO LARGE'} "
          f"(rtol {args.rtol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
