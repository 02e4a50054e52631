"""cuda_mlp.py: PyTorch's time for the training step bench_cuda_mlp.c times in libfsdp.

The same MLP (Linear + ReLU, widths 4096-8192-8192-4096 by default), batch, MSE loss and
AdamW (lr 1e-4, weight decay 0.01, PyTorch's default implementation for CUDA tensors), eager
mode, in f32, TF32 (torch.backends.cuda.matmul.allow_tf32) and bf16 autocast with f32 master
weights. Median ms per step after 3 warm-up steps; each step ends with a synchronize, as
libfsdp's does. Not a dependency of the build: run by bench/cuda_mlp.sh where torch exists.
"""
import argparse
import statistics
import time


def step_time(widths, batch, steps, mode):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.manual_seed(0)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    x = torch.rand(batch, widths[0], device="cuda") * 2 - 1
    y = torch.rand(batch, widths[-1], device="cuda") * 2 - 1
    times = []
    for s in range(-3, steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if s >= 0:
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="4096,8192,8192,4096")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--mode", default="all", choices=["f32", "tf32", "bf16", "all"])
    a = ap.parse_args()
    import torch  # after --help, which needs none

    widths = [int(w) for w in a.widths.split(",")]
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    for mode in ["f32", "tf32", "bf16"]:
        if a.mode in ("all", mode):
            ms, loss = step_time(widths, a.batch, a.steps, mode)
            print(f"pytorch {mode:5s} {ms:9.2f} ms/step  (last loss {loss:.6f})")


if __name__ == "__main__":
    main()
