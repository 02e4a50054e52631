#!/usr/bin/env python3
"""Generate the PyTorch reference fixtures that tests/test_fixtures.c checks libfsdp against.

Each case builds a layer, seed model or loss in PyTorch (float32, CPU), runs it forward and
backward on deterministic random data, and writes every tensor the C test needs to one
binary file, tests/fixtures/<case>.bin, in the format described in tests/fixtures/README.md.
The outputs are committed, so building and testing libfsdp never needs PyTorch.

Rerun (from the repository root) after changing a case, then commit the .bin files:

    python3 tools/gen_fixtures.py                 # writes tests/fixtures/*.bin
    python3 tools/gen_fixtures.py --out build/fx  # somewhere else
    python3 tools/gen_fixtures.py --only linear   # one case

Every case calls torch.manual_seed with a seed derived from its name (CRC-32), so the
files do not depend on which other cases exist or run. Layer and model cases store:

    x            the input
    <param>      every parameter under its PyTorch name, in named_parameters() order
    dout         a random upstream gradient, shaped like the output
    y            the output
    dx           d(sum(y * dout))/dx
    grad.<param> d(sum(y * dout))/d<param>, in the same order as the parameters

Loss cases store the input(s), `loss` (0-d) and `dx` = d(loss)/dx.
"""

import argparse
import os
import struct
import sys
import warnings
import zlib

# The cases, in the order they run (CASES below maps each name to its function): their names
# and options are plain data, before torch's import, so that --help, which lists them, needs no
# torch. A layer, model or loss case runs case_<name>().
LAYER_CASES = (
    "linear", "linear_3d", "linear_nobias", "relu", "sigmoid", "gelu", "rmsnorm", "sequential",
    "mlp_module", "mlp_stacked", "simple_mlp", "simple_model", "net_small", "loss_sum", "loss_mse",
    "loss_cross_entropy", "convert_f16",
)

# Optimizer trajectories: two parameters (a (4, 3) weight and a (4,) bias) updated for
# OPTIM_STEPS steps from stored gradients, so the C test checks the update rule alone.
# `options` (float64, PyTorch's own Python floats) is
# [kind (0 SGD, 1 Adam, 2 AdamW), lr, momentum, dampening, weight_decay, nesterov, maximize,
#  beta1, beta2, eps, amsgrad].
OPTIM_STEPS = 20
OPTIM_CONFIGS = {
    "sgd": ("sgd", dict(lr=0.1)),
    "sgd_momentum": ("sgd", dict(lr=0.1, momentum=0.9)),
    "sgd_dampening": ("sgd", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    "sgd_nesterov": ("sgd", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)),
    "sgd_maximize": ("sgd", dict(lr=0.02, momentum=0.5, maximize=True)),
    "adam": ("adam", dict(lr=0.01)),
    "adam_weight_decay": ("adam", dict(lr=0.01, weight_decay=0.1)),
    "adam_amsgrad": ("adam", dict(lr=0.02, betas=(0.8, 0.95), eps=1e-6, amsgrad=True)),
    "adam_maximize": ("adam", dict(lr=0.01, maximize=True, weight_decay=0.05)),
    "adamw": ("adamw", dict(lr=0.01, weight_decay=0.1)),
    "adamw_amsgrad": ("adamw", dict(lr=0.005, weight_decay=0.2, amsgrad=True)),
}


# Option groups (PyTorch's param_groups): five parameters with module paths, net1 = Linear(3, 4),
# norm.weight (4,), net2 = Linear(4, 2), each taking the first group whose fnmatch pattern
# matches its name (libfsdp's fsdp_param_group rule; Python's fnmatch lets '*' match '.' as
# POSIX fnmatch without flags does) and the optimizer's own options otherwise. The learning
# rate follows LambdaLR(1 / (1 + 0.2 * step)), which scales every group's initial lr. Stored:
# init.<p>, grad.<step>.<p>, param.<step>.<p> as in the trajectories above; group.<p> (i32, the
# group index, -1 for none); lr.<step> (f64, the lr of the optimizer's own options and then of
# each group, as PyTorch used it in that step). tests/test_optim.c holds the same options.
GROUP_STEPS = 10
GROUP_CONFIGS = {
    "sgd": ("sgd", dict(lr=0.1, momentum=0.9, weight_decay=0.01),
            [("*.bias", dict(weight_decay=0.0, momentum=0.0)),
             ("norm.*", dict(lr=0.05, dampening=0.5, weight_decay=0.0))]),
    "adamw": ("adamw", dict(lr=0.01, weight_decay=0.1),
              [("*.bias", dict(weight_decay=0.0)),
               ("norm.*", dict(lr=0.003, weight_decay=0.0)),
               ("net2.*", dict(betas=(0.8, 0.95), eps=1e-6))]),
}


CLIP_CONFIGS = {"clip_norm2": (1.5, 2.0), "clip_norm_inf": (0.7, float("inf")),
                "clip_norm2_unclipped": (100.0, 2.0)}


CASE_NAMES = (list(LAYER_CASES) + [f"optim_{name}" for name in OPTIM_CONFIGS]
              + [f"optim_groups_{name}" for name in GROUP_CONFIGS] + list(CLIP_CONFIGS))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                               "fixtures")
    parser.add_argument("--out", default=os.path.normpath(default_out),
                        help="output folder (default: tests/fixtures of this repository)")
    parser.add_argument("--only", action="append", choices=sorted(CASE_NAMES),
                        help="generate only this case (repeatable)")
    return parser.parse_args()


# The command line is read before torch's import (seconds), which --help and a bad option
# need not wait for.
ARGS = parse_args() if __name__ == "__main__" else None

# torch warns at import when numpy is missing; this script does not use numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
from torch import nn  # noqa: E402

MAGIC = b"FSDPFX01"
DTYPE_CODES = {torch.float32: 0, torch.int32: 1, torch.float64: 2}
PACK_CHARS = {torch.float32: "f", torch.int32: "i", torch.float64: "d"}
MAX_DIMS = 4
# Keep the committed fixtures small; a case over this is a mistake in the case.
MAX_FILE_BYTES = 512 * 1024


def write_fixture(path, tensors):
    """Writes [(name, tensor)] in order to path; returns the number of bytes written."""
    out = bytearray(MAGIC)
    out += struct.pack("<I", len(tensors))
    seen = set()
    for name, t in tensors:
        if name in seen:
            raise ValueError(f"{path}: tensor '{name}' stored twice")
        seen.add(name)
        t = t.detach().contiguous().cpu()
        if t.dtype not in DTYPE_CODES:
            raise ValueError(f"{path}: tensor '{name}' has unsupported dtype {t.dtype}")
        if t.dim() > MAX_DIMS:
            raise ValueError(f"{path}: tensor '{name}' has {t.dim()} dims (max {MAX_DIMS})")
        encoded = name.encode("utf-8")
        out += struct.pack("<I", len(encoded)) + encoded
        out += struct.pack("<II", DTYPE_CODES[t.dtype], t.dim())
        out += struct.pack(f"<{t.dim()}q", *t.shape)
        # No numpy needed: float32 -> Python float -> float32 is exact.
        values = t.reshape(-1).tolist()
        out += struct.pack(f"<{len(values)}{PACK_CHARS[t.dtype]}", *values)
    if len(out) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: {len(out)} bytes, over the {MAX_FILE_BYTES} byte limit")
    with open(path, "wb") as f:
        f.write(out)
    return len(out)


# The seed models, with the module and parameter names of the seed scenarios.


class MLPModule(nn.Module):
    """torch.testing._internal.distributed._tensor.common_dtensor.MLPModule."""

    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 16)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(16, 10)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class MLPStacked(nn.Module):
    """common_dtensor.MLPStacked: layers.0 ... layers.<n-1>, each an MLPModule."""

    def __init__(self, n_layers=2):
        super().__init__()
        self.layers = nn.ModuleList([MLPModule() for _ in range(n_layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class SimpleMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(50, 32)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(32, 8)

    def forward(self, x):
        return torch.sigmoid(self.net2(self.relu(self.net1(x))))


class SimpleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(5, 8)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(8, 4)
        self.net3 = nn.Linear(4, 12)

    def forward(self, x):
        return self.net3(self.net2(self.relu(self.net1(x))))


class Net(nn.Module):
    """The seed's Net (fc1 ... fc4, no activations) at a small width."""

    def __init__(self, dim):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)
        self.fc3 = nn.Linear(dim, dim)
        self.fc4 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc4(self.fc3(self.fc2(self.fc1(x))))


# Cases. Each returns the ordered [(name, tensor)] list of its file.


def module_case(module, x, extra=()):
    """Forward and backward of module on x with a random dout; the layer/model layout."""
    x = x.detach().clone().requires_grad_(True)
    y = module(x)
    dout = torch.randn_like(y)
    (y * dout).sum().backward()
    params = list(module.named_parameters())
    tensors = [("x", x)]
    tensors += [(name, p) for name, p in params]
    tensors += [("dout", dout), ("y", y), ("dx", x.grad)]
    tensors += [("grad." + name, p.grad) for name, p in params]
    tensors += list(extra)
    return tensors


def case_linear():
    return module_case(nn.Linear(7, 5), torch.randn(6, 7))


def case_linear_3d():
    return module_case(nn.Linear(7, 5), torch.randn(2, 3, 7))


def case_linear_nobias():
    return module_case(nn.Linear(7, 5, bias=False), torch.randn(6, 7))


def case_relu():
    x = torch.randn(4, 9)
    # PyTorch's ReLU gradient at exactly 0 is 0 (threshold_backward passes x > 0).
    x[0, 0] = 0.0
    x[2, 5] = 0.0
    x[3, 8] = -0.0
    return module_case(nn.ReLU(), x)


def case_sigmoid():
    x = torch.randn(4, 8) * 3
    # Saturated values: exp(-x) overflows float32 for x < -88.7 in a naive formula.
    x[0] = torch.tensor([-100.0, -90.0, -50.0, -20.0, 20.0, 50.0, 90.0, 100.0])
    x[1, :4] = torch.tensor([-15.0, -10.0, 10.0, 15.0])
    return module_case(nn.Sigmoid(), x)


def case_gelu():
    x = torch.randn(5, 11) * 2
    x[0, :6] = torch.tensor([-12.0, -6.0, -3.0, 3.0, 6.0, 12.0])
    x[1, 0] = 0.0
    return module_case(nn.GELU(approximate="tanh"), x)


def case_rmsnorm():
    eps = 1e-6
    norm = nn.RMSNorm(10, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(10))
    x = torch.randn(3, 4, 10)
    return module_case(norm, x, extra=[("eps", torch.tensor(eps, dtype=torch.float32))])


def case_sequential():
    seq = nn.Sequential(nn.Linear(6, 9), nn.GELU(approximate="tanh"), nn.Linear(9, 4))
    return module_case(seq, torch.randn(5, 6))


def case_mlp_module():
    return module_case(MLPModule(), torch.randn(12, 10))


def case_mlp_stacked():
    return module_case(MLPStacked(n_layers=2), torch.randn(12, 10))


def case_simple_mlp():
    return module_case(SimpleMLP(), torch.randn(8, 50))


def case_simple_model():
    return module_case(SimpleModel(), torch.randn(6, 5))


def case_net_small():
    return module_case(Net(64), torch.randn(4, 64))


def case_convert_f16():
    """torch's f32 -> float16 and f32 -> bfloat16 conversions (.to(dtype)) on chosen f32 bit
    patterns: zeros, infinities, NaNs, the f16 overflow threshold (65504, 65520), the
    smallest normals and subnormals, exact ties between neighbours (normal and subnormal),
    and random patterns, uniform over the bits and over the f16 range. Stored as int32:
    x_bits (the f32 bits), f16_bits and bf16_bits (the 16-bit results, zero-extended)."""
    def bits(v):
        return struct.unpack("<i", struct.pack("<f", v))[0]
    named = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 65504.0, 65519.99,
             65520.0, 65536.0, -65520.0, 1e5, 3.4e38, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
             1.5 * 2.0 ** -25, 3 * 2.0 ** -25, 5 * 2.0 ** -25, 2.0 ** -25 * (1 + 2.0 ** -23),
             1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8,
             (2.0 ** -14) * (1 - 2.0 ** -11), 1e-45, -1e-8, 0.1, -2.5, 1.0 / 3.0]
    xs = [bits(v) for v in named] + [0x7F800001, 0x7FC00000, -1, 0x7FA00000]
    # every sign and exponent with mantissas at the f16 rounding boundaries
    for e in range(96, 146):
        for m in (0, 0xFFF, 0x1000, 0x1FFF, 0x2000, 0x3000, 0x7FFFFF):
            xs.append((e << 23) | m)
            xs.append(-(1 << 31) | (e << 23) | m)
    g = torch.Generator().manual_seed(case_seed("convert_f16"))
    anybits = torch.randint(-(2 ** 31), 2 ** 31, (3000,), generator=g, dtype=torch.int64)
    in_range = torch.randint(96 << 23, 146 << 23, (3000,), generator=g, dtype=torch.int64)
    sign = torch.randint(0, 2, (3000,), generator=g, dtype=torch.int64) << 31
    xs += [int(v) for v in anybits] + [int(v) - (1 << 32) * ((int(v) >> 31) & 1)
                                        for v in (in_range | sign)]
    # midpoints between neighbouring f16 values (ties), normal and subnormal, both signs
    h = torch.randint(1, 0x7BFF, (1000,), generator=g, dtype=torch.int64)
    lo = torch.tensor(h.tolist(), dtype=torch.int16).view(torch.float16).float()
    hi = torch.tensor((h + 1).tolist(), dtype=torch.int16).view(torch.float16).float()
    mids = ((lo.double() + hi.double()) / 2).float()  # exact in f32
    xs += [bits(float(v)) for v in mids] + [bits(-float(v)) for v in mids]
    x = torch.tensor(xs, dtype=torch.int32)
    f = x.view(torch.float32)
    f16 = f.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    bf16 = f.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    return [("x_bits", x), ("f16_bits", f16), ("bf16_bits", bf16)]


def loss_tensors(inputs, loss, x):
    loss.backward()
    return inputs + [("loss", loss), ("dx", x.grad)]


def case_loss_sum():
    x = torch.randn(4, 6, requires_grad=True)
    return loss_tensors([("x", x)], x.sum(), x)


def case_loss_mse():
    x = torch.randn(4, 6, requires_grad=True)
    target = torch.randn(4, 6)
    loss = nn.functional.mse_loss(x, target, reduction="mean")
    return loss_tensors([("x", x), ("target", target)], loss, x)


def case_loss_cross_entropy():
    logits = torch.randn(5, 7) * 2
    # Large logits: a softmax without the max subtraction overflows float32.
    logits[0, 3] = 100.0
    logits[1, :] = torch.tensor([-40.0, 90.0, 5.0, 89.0, 0.0, -90.0, 1.0])
    logits[2, 6] = -100.0
    logits.requires_grad_(True)
    targets = torch.tensor([3, 3, 6, 0, 2], dtype=torch.int32)
    loss = nn.functional.cross_entropy(logits, targets.long(), reduction="mean")
    return loss_tensors([("x", logits), ("targets", targets)], loss, logits)


def optim_case(kind, kw):
    weight = nn.Parameter(torch.randn(4, 3))
    bias = nn.Parameter(torch.randn(4))
    params = [("weight", weight), ("bias", bias)]
    make = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    # foreach=False: the single-tensor update, whose operation order the C code follows.
    opt = make([weight, bias], foreach=False, **kw)
    group = opt.param_groups[0]
    betas = group.get("betas", (0.0, 0.0))
    options = [
        {"sgd": 0, "adam": 1, "adamw": 2}[kind], group["lr"], group.get("momentum", 0.0),
        group.get("dampening", 0.0), group["weight_decay"], float(group.get("nesterov", False)),
        float(group["maximize"]), betas[0], betas[1], group.get("eps", 0.0),
        float(group.get("amsgrad", False)),
    ]
    tensors = [("options", torch.tensor(options, dtype=torch.float64))]
    tensors += [(f"init.{n}", p.detach().clone()) for n, p in params]
    for step in range(OPTIM_STEPS):
        # Large gradients first, small later, so amsgrad's running max differs from v.
        scale = 2.0 if step < 5 else 0.3
        for n, p in params:
            p.grad = torch.randn_like(p) * scale
            tensors.append((f"grad.{step}.{n}", p.grad.clone()))
        opt.step()
        tensors += [(f"param.{step}.{n}", p.detach().clone()) for n, p in params]
    return tensors


class GroupModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(3, 4)
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.randn(4))
        self.net2 = nn.Linear(4, 2)


def optim_groups_case(kind, defaults, groups):
    import fnmatch
    model = GroupModel()
    params = list(model.named_parameters())
    member = {}
    for name, _ in params:
        member[name] = next((i for i, (pat, _) in enumerate(groups)
                             if fnmatch.fnmatchcase(name, pat)), -1)
    param_groups = [{"params": [p for n, p in params if member[n] == -1]}]
    for i, (_, kw) in enumerate(groups):
        param_groups.append(dict(params=[p for n, p in params if member[n] == i], **kw))
    make = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[kind]
    opt = make(param_groups, foreach=False, **defaults)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1.0 + 0.2 * step))
    tensors = [(f"group.{n}", torch.tensor(member[n], dtype=torch.int32)) for n, _ in params]
    tensors += [(f"init.{n}", p.detach().clone()) for n, p in params]
    for step in range(GROUP_STEPS):
        scale = 2.0 if step < 3 else 0.3
        for n, p in params:
            p.grad = torch.randn_like(p) * scale
            tensors.append((f"grad.{step}.{n}", p.grad.clone()))
        lrs = [g["lr"] for g in opt.param_groups]
        tensors.append((f"lr.{step}", torch.tensor(lrs, dtype=torch.float64)))
        opt.step()
        sched.step()
        tensors += [(f"param.{step}.{n}", p.detach().clone()) for n, p in params]
    return tensors


def clip_case(max_norm, norm_type):
    """torch.nn.utils.clip_grad_norm_ over a Linear(3, 4)'s gradients."""
    layer = nn.Linear(3, 4)
    for p in layer.parameters():
        p.grad = torch.randn_like(p) * 3.0
    tensors = [("options", torch.tensor([max_norm, norm_type], dtype=torch.float64))]
    tensors += [(f"grad.{n}", p.grad.clone()) for n, p in layer.named_parameters()]
    total = torch.nn.utils.clip_grad_norm_(layer.parameters(), max_norm, norm_type=norm_type)
    tensors.append(("total_norm", total.detach().clone()))
    tensors += [(f"clipped.{n}", p.grad.clone()) for n, p in layer.named_parameters()]
    return tensors


def optim_cases():
    return {f"optim_{name}": (lambda k=kind, kw=kw: optim_case(k, kw))
            for name, (kind, kw) in OPTIM_CONFIGS.items()}


CASES = {name: globals()["case_" + name] for name in LAYER_CASES}
CASES.update(optim_cases())
CASES.update({f"optim_groups_{name}": (lambda a=a: optim_groups_case(*a))
              for name, a in GROUP_CONFIGS.items()})
CASES.update({name: (lambda a=a: clip_case(*a)) for name, a in CLIP_CONFIGS.items()})


def check_finite(case, tensors):
    for name, t in tensors:
        if t.dtype == torch.float32 and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{case}: tensor '{name}' is not finite")


def case_seed(case):
    """A seed from the case's name alone, so adding a case changes no other file."""
    return zlib.crc32(case.encode("utf-8"))


def main(args):
    torch.set_num_threads(1)  # one summation order, run to run
    os.makedirs(args.out, exist_ok=True)
    total = 0
    for case, make in CASES.items():
        if args.only and case not in args.only:
            continue
        torch.manual_seed(case_seed(case))
        tensors = make()
        check_finite(case, tensors)
        size = write_fixture(os.path.join(args.out, case + ".bin"), tensors)
        total += size
        print(f"{case + '.bin':28s} {size:8d} bytes  {len(tensors):3d} tensors")
    print(f"{'total':28s} {total:8d} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
