"""fsdp_gpu.py: PyTorch's side of bench/fsdp_gpu.sh: FSDP2 at world size 1 on the MLP that
bench_fsdp_gpu.c times in libfsdp's "mp" mode.

The same model (Linear + ReLU, widths 4096-8192-8192-4096 by default), batch, MSE loss and
AdamW (lr 1e-4, weight decay 0.01, fused=True: the implementation a user picks on a GPU), each
Linear wrapped by fully_shard and then the root, MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32): bf16 compute with f32 sharded master weights, as libfsdp's param_dtype
bf16 with its bf16 compute policy. Median ms per step after the warm-up steps; each step ends
with loss.item() and torch.cuda.synchronize, as libfsdp's ends with the loss on the host and a
device synchronize. --device cpu (gloo) checks the script where no GPU is; not a measurement.
Not a dependency of the build: bench/fsdp_gpu.sh runs it where torch is importable.
"""
import argparse
import os
import socket
import statistics
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="4096,8192,8192,4096")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = ap.parse_args()
    import torch  # after --help, which needs none
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    widths = [int(w) for w in a.widths.split(",")]
    cuda = a.device == "cuda"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    name = torch.cuda.get_device_name(0) if cuda else "the CPU (a check, not a measurement)"
    print(f"PyTorch {torch.__version__} FSDP2 at world 1 on {name}")
    torch.manual_seed(0)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(dev)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    x = torch.rand(a.batch, widths[0], device=dev) * 2 - 1
    y = torch.rand(a.batch, widths[-1], device=dev) * 2 - 1
    times = []
    loss = 0.0
    for s in range(-a.warmup, a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        out = model(x)
        l = torch.nn.functional.mse_loss(out.float(), y)
        loss = l.item()
        l.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if s >= 0:
            times.append(1e3 * (time.perf_counter() - t0))
    print(f"result pytorch mp step_ms {statistics.median(times):.3f} (last loss {loss:.6f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
