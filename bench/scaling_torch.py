#!/usr/bin/env python3
"""scaling_torch.py: the training step of bench_scaling in PyTorch on the CPU, one process,
torch.set_num_threads(T) for each T of --threads: the MLP of --widths (ReLU), MSE loss, SGD
(lr 1e-4), global batch --batch, median ms per step over --steps after --warmup; zero_grad
as users call it (set_to_none, so PyTorch fills no gradient buffer where libfsdp zeroes one). Prints one
line per thread count: `pytorch threads T ms M`. Run by bench/scaling.sh; not a build
dependency (it needs torch)."""
import argparse
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default="1024,4096,4096,1024")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", default="1,2,4")
    a = ap.parse_args()
    import torch  # after --help, which needs none

    widths = [int(w) for w in a.widths.split(",")]
    torch.manual_seed(0)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.rand(a.batch, widths[0]) - 0.5
    y = torch.rand(a.batch, widths[-1]) - 0.5
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        times = []
        for s in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            opt.zero_grad()  # PyTorch's default: set_to_none, no fill
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if s >= a.warmup:
                times.append(time.perf_counter() - t0)
        print(f"pytorch threads {threads} ms {1e3 * statistics.median(times):.1f}", flush=True)


if __name__ == "__main__":
    main()
