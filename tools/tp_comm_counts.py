#!/usr/bin/env python3
"""Collective counts of PyTorch's test_parallelize_api.py scenarios (4 CPU ranks, gloo).

Reproduces the 8 tests of the seed (PyTorch test/distributed/tensor/parallel/
test_parallelize_api.py) and records, per test, the collectives issued by
  parallelize   - parallelize_module() itself
  forward       - dist_module(inp)
  post          - redistribute/to_local of a DTensor output (outside forward)
  backward      - output.sum().backward()  (model input does not require grad)
  optim         - one torch.optim.SGD(lr=0.25) step
plus CommDebugMode's per-module forward/backward attribution over fwd+post+bwd.

Reference only: used to derive expected comm counts for libfsdp's C port.
Usage: python3 tools/tp_comm_counts.py
"""
import argparse
import json
import os
import socket
import sys
import tempfile
from collections import OrderedDict, defaultdict
from copy import deepcopy


def parse_args():
    return argparse.ArgumentParser(
        description=__doc__ + "\nPrints one line per test, region and collective with its count, "
        "then whether every rank agrees; exits 0 (2: a bad command line).",
        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()


# The command line is read before torch's import (seconds), which --help and a bad option
# need not wait for; the ranks mp.spawn starts import this file as __mp_main__ and skip it.
ARGS = parse_args() if __name__ == "__main__" else None

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.debug import CommDebugMode  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    parallelize_module,
)

WORLD = 4
LR = 0.25


class MLPModule(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.net1 = nn.Linear(10, 16)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(16, 10)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class MLPStacked(nn.Module):
    def __init__(self, n_layers=2):
        super().__init__()
        self.layers = nn.ModuleList([MLPModule() for _ in range(n_layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class DummyModule(nn.Module):
    def forward(self, x):
        return x


def opname(k):
    s = str(k)
    for p in ("c10d_functional.", "_c10d_functional.", "c10d."):
        if s.startswith(p):
            s = s[len(p):]
    return s


def counts_of(d):
    return {opname(k): int(v) for k, v in d.items() if v}


def diff(a, b):
    out = {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b)}
    return {k: v for k, v in out.items() if v}


def self_module_counts(cm):
    """Per-module collectives excluding those propagated up from sub-modules."""
    mc = cm.comm_module_counts
    parents = cm.advanced_module_tracker.module_parents_dict
    selfc = {}
    for name in mc:
        for key in ("forward", "backward"):
            selfc[(name, key)] = defaultdict(int, counts_of(mc[name][key]))
    for name in mc:
        if name == "Global":
            continue
        anc = [p for p in parents.get(name, ()) if p != name and p in mc]
        if not anc:
            continue
        # immediate parent = longest ancestor FQN ("Global" has no dot prefix)
        imm = max(anc, key=lambda p: (p != "Global", len(p)))
        for key in ("forward", "backward"):
            for op, n in counts_of(mc[name][key]).items():
                selfc[(imm, key)][op] -= n
    rows = []
    for (name, key), d in selfc.items():
        for op, n in d.items():
            if n:
                rows.append([name, key, op, n])
    return sorted(rows)


def close(a, b):
    return bool(a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-4))


def full(t):
    if isinstance(t, DTensor):
        return t.redistribute(t.device_mesh, [Replicate()]).to_local()
    return t


def compare_params(local, distm, grad=False):
    bad = []
    for name, p in local.named_parameters():
        dp = distm.get_parameter(name)
        a, b = (p.grad, dp.grad) if grad else (p, dp)
        if not close(a, full(b)):
            bad.append(name)
    return bad


def run_compare_module(res, mesh, local, distm, inp_size, rowwise=False):
    rank = dist.get_rank()
    lopt = torch.optim.SGD(local.parameters(), lr=LR)
    dopt = torch.optim.SGD(distm.parameters(), lr=LR)
    torch.manual_seed(0)
    inp = torch.rand(*inp_size)
    res["checks"]["params_init_mismatch"] = compare_params(local, distm)
    local_out = local(inp)
    dinp = inp.chunk(WORLD, dim=-1)[rank] if rowwise else inp

    with CommDebugMode() as cm:
        snap0 = counts_of(cm.get_comm_counts())
        out = distm(dinp)
        snap1 = counts_of(cm.get_comm_counts())
        res["out_is_dtensor"] = isinstance(out, DTensor)
        if isinstance(out, DTensor):
            out = out.redistribute(out.device_mesh, [Replicate()]).to_local()
        snap2 = counts_of(cm.get_comm_counts())
        out.sum().backward()
        snap3 = counts_of(cm.get_comm_counts())
    res["regions"]["forward"] = diff(snap0, snap1)
    res["regions"]["post"] = diff(snap1, snap2)
    res["regions"]["backward"] = diff(snap2, snap3)
    res["modules"] = self_module_counts(cm)
    res["sharding"] = {k: str(v) for k, v in cm.get_sharding_info().items()}

    res["checks"]["output_match"] = close(local_out, out)
    local_out.sum().backward()
    res["checks"]["grad_mismatch"] = compare_params(local, distm, grad=True)
    # raw per-rank local grads (to check rank agreement of e.g. bias.grad)
    res["local_grads"] = {
        n: (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).tolist()
        for n, p in distm.named_parameters()
    }
    res["ref_grads"] = {n: p.grad.tolist() for n, p in local.named_parameters()}
    res["grad_placements"] = {
        n: str(p.grad.placements) if isinstance(p.grad, DTensor) else "plain"
        for n, p in distm.named_parameters()
    }

    lopt.step()
    with CommDebugMode() as cm:
        dopt.step()
    res["regions"]["optim"] = counts_of(cm.get_comm_counts())
    res["checks"]["params_after_step_mismatch"] = compare_params(local, distm)


def par(res, module, mesh, plan):
    with CommDebugMode() as cm:
        m = parallelize_module(module, mesh, plan)
    res["regions"]["parallelize"] = counts_of(cm.get_comm_counts())
    return m


def t_rowwise(res, mesh):
    torch.manual_seed(5)
    model = nn.Linear(16, 10)
    tp = par(res, deepcopy(model), mesh, RowwiseParallel())
    torch.manual_seed(dist.get_rank())
    run_compare_module(res, mesh, model, tp, [9, 16], rowwise=True)


def t_colwise(res, mesh):
    torch.manual_seed(5)
    model = nn.Linear(10, 16)
    tp = par(res, deepcopy(model), mesh, ColwiseParallel(output_layouts=Replicate()))
    run_compare_module(res, mesh, model, tp, [8, 10])


def t_prep_input(res, mesh):
    module = DummyModule()
    par(res, module, mesh, PrepareModuleInput(input_layouts=Shard(0),
                                              desired_input_layouts=Replicate()))
    inp = torch.rand(5, 7)
    with CommDebugMode() as cm:
        a = counts_of(cm.get_comm_counts())
        out = module(inp)
        b = counts_of(cm.get_comm_counts())
        res["out_is_dtensor"] = isinstance(out, DTensor)
        out = out.redistribute(mesh, [Shard(0)]).to_local()
        c = counts_of(cm.get_comm_counts())
    res["regions"].update(forward=diff(a, b), post=diff(b, c))
    res["modules"] = self_module_counts(cm)
    res["checks"]["output_match"] = close(inp, out)


def t_prep_output(res, mesh):
    module = DummyModule()
    par(res, module, mesh, PrepareModuleOutput(output_layouts=Replicate(),
                                               desired_output_layouts=Shard(0)))
    torch.manual_seed(15)
    inp = torch.rand(16, 7)
    with CommDebugMode() as cm:
        a = counts_of(cm.get_comm_counts())
        dt = DTensor.from_local(inp, mesh, [Replicate()], run_check=False)
        out = module(dt)
        b = counts_of(cm.get_comm_counts())
        res["out_is_dtensor"] = isinstance(out, DTensor)
        ref = dt.redistribute(mesh, [Shard(0)]).to_local()
        c = counts_of(cm.get_comm_counts())
    res["regions"].update(forward=diff(a, b), post=diff(b, c))
    res["modules"] = self_module_counts(cm)
    res["checks"]["output_match"] = close(ref, out)


def _mlp_plan_test(plan, model_cls):
    def t(res, mesh):
        model = model_cls()
        tp = par(res, deepcopy(model), mesh, plan())
        run_compare_module(res, mesh, model, tp, [12, 10])
    return t


TESTS = OrderedDict([
    ("test_linear_row_wise_parallel", t_rowwise),
    ("test_linear_col_wise_parallel", t_colwise),
    ("test_prepare_module_input", t_prep_input),
    ("test_prepare_module_output", t_prep_output),
    ("test_parallelize_module_with_star", _mlp_plan_test(
        lambda: {"net*": ColwiseParallel(output_layouts=Replicate())}, MLPModule)),
    ("test_parallelize_module_with_question", _mlp_plan_test(
        lambda: {"net?": ColwiseParallel(output_layouts=Replicate())}, MLPModule)),
    ("test_parallelize_module_with_digit", _mlp_plan_test(
        lambda: {"net[1-2]": ColwiseParallel(output_layouts=Replicate())}, MLPModule)),
    ("test_parallelize_module_multi_wildcard", _mlp_plan_test(
        lambda: {"layers.*.net[1]": ColwiseParallel(),
                 "layers.*.net[2]": RowwiseParallel()},
        lambda: MLPStacked(n_layers=2))),
])


def worker(rank, port, outdir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    results = OrderedDict()
    for name, fn in TESTS.items():
        res = {"regions": {}, "checks": {}, "modules": []}
        try:
            fn(res, mesh)
        except Exception as e:  # report, keep going
            import traceback
            res["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
            res["tb"] = traceback.format_exc()
        results[name] = res
        dist.barrier()
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REGIONS = ["parallelize", "forward", "post", "backward", "optim"]


def main():
    # The ranks' results pass through a folder removed at the end, also when a rank fails.
    with tempfile.TemporaryDirectory(prefix="tp_comm_") as outdir:
        mp.spawn(worker, args=(free_port(), outdir), nprocs=WORLD, join=True)
        R = []
        for r in range(WORLD):
            with open(os.path.join(outdir, f"rank{r}.json")) as f:
                R.append(json.load(f))
    ok_all = True
    print(f"{'test':40s} {'region':11s} {'op':28s} count")
    for name in TESTS:
        r0 = R[0][name]
        if "error" in r0:
            print(f"{name:40s} ERROR {r0['error']}\n{r0['tb']}")
        for reg in REGIONS:
            if reg not in r0["regions"]:
                print(f"{name:40s} {reg:11s} {'(n/a: not in seed test)':28s} -")
                continue
            c = r0["regions"][reg]
            agree = all(R[k][name]["regions"].get(reg) == c for k in range(WORLD))
            ok_all &= agree
            flag = "" if agree else "   !! RANKS DISAGREE: " + str(
                [R[k][name]["regions"].get(reg) for k in range(WORLD)])
            if not c:
                print(f"{name:40s} {reg:11s} {'-':28s} 0{flag}")
            for op, n in sorted(c.items()):
                print(f"{name:40s} {reg:11s} {op:28s} {n}{flag}")
    print("\nPer-module attribution (CommDebugMode comm_module_counts, self only,"
          " over forward+post+backward; rank 0):")
    for name in TESTS:
        r0 = R[0][name]
        same = all(R[k][name].get("modules") == r0.get("modules") for k in range(WORLD))
        for mod, key, op, n in r0.get("modules", []):
            print(f"  {name:40s} {mod:28s} {key:8s} {op:22s} {n}"
                  + ("" if same else "  !! RANKS DISAGREE"))
    print("\nCorrectness checks (all ranks):")
    for name in TESTS:
        chk = [R[k][name]["checks"] for k in range(WORLD)]
        print(f"  {name:40s} out_dtensor={R[0][name].get('out_is_dtensor')} "
              + " ".join(f"{k}={[c.get(k) for c in chk]}" for k in chk[0]))
    r = [R[k]["test_linear_row_wise_parallel"] for k in range(WORLD)]
    if "local_grads" in r[0]:
        bg = [torch.tensor(x["local_grads"]["bias"]) for x in r]
        ref = torch.tensor(r[0]["ref_grads"]["bias"])
        ident = all(torch.equal(bg[0], b) for b in bg)
        print("\nrowwise bias.grad placements:", r[0]["grad_placements"]["bias"],
              "| identical on all ranks:", ident,
              "| equal to reference per rank:", [close(b, ref) for b in bg])
        print("  rank local bias.grad[:3]:", [b[:3].tolist() for b in bg],
              " ref[:3]:", ref[:3].tolist())
        print("  sum over ranks == ref:", close(sum(bg), ref))
        print("rowwise output matches reference on ranks:",
              [x["checks"]["output_match"] for x in r])
    print("\nget_sharding_info() (rank0, multi_wildcard):",
          R[0]["test_parallelize_module_multi_wildcard"].get("sharding"))
    print("ALL RANKS AGREE ON COUNTS:", ok_all)


if __name__ == "__main__":
    main()
