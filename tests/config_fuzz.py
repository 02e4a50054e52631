#!/usr/bin/env python3
"""config_fuzz.py: random valid fsdp-train configurations, each run on its layout and on one
rank, compared step by step.

Each configuration draws the model (2 to 4 Linear layers of width 1 to 12, an activation),
the layout (dp 1 to 4, tp 1 to 3, fsdp with any strategy, wrap, offload, use_orig_params and
replicas, or replicate; sync_module_states), the data (samples, batch size, teacher, noise,
seeds) and SGD (lr, momentum, Nesterov, weight decay). The run on its layout must give the
single-rank run's loss at every step and the whole-dataset loss before and after training to
float32 rounding (RTOL below), and neither run may print a sanitizer report or fail. Meant for
the AddressSanitizer + UBSan build (make fuzz-config); any fsdp-train works.

    python3 tests/config_fuzz.py --exe build-asan/fsdp-train --count 300 --seed 1

Exit status 0 when every configuration passes, 1 otherwise (each failure is printed with its
configuration file, kept under --keep). Python 3 standard library only.
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

# Tolerance on every compared loss: |got - want| <= RTOL * |want| + ATOL * first, with `first`
# the whole-dataset loss before training. The layouts sum the same float32 terms in another
# order (gradients reduced over at most 4 dp ranks, activations over 3 tp ranks, losses over
# dp), so each step differs by a few ulps (2^-24 = 6e-8 relative), which the few steps of SGD
# (lr <= 0.1, momentum < 1) carry forward without amplifying much. The worst relative
# difference seen (each run prints it) was 2.3e-6 over 1000 configurations (seed 2) and 4.9e-7
# over 300 (seed 1): RTOL leaves a margin of about 9x. ATOL covers a loss that training drives
# towards 0, where a relative bound on rounding means nothing.
RTOL = 2e-5
ATOL = 1e-6

SANITIZER_MARKS = ("runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                   "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer")


def widths_for(rng, tp):
    """Layer widths whose hidden widths split by Colwise/Rowwise pairs divide by tp."""
    n_linear = rng.randint(1, 4)
    w = [rng.randint(1, 8)] + [rng.randint(1, 12) for _ in range(n_linear)]
    for i in range(0, n_linear - 1, 2):  # pair (i, i + 1) shards width i + 1 over tp
        w[i + 1] = tp * rng.randint(1, max(1, 12 // tp))
    return w


def random_config(rng):
    """A valid configuration as {section: {key: value}} (values as INI text)."""
    tp = rng.choice([1, 1, 2, 2, 3])
    dp = rng.randint(1, 4)
    widths = widths_for(rng, tp)
    if len(widths) == 2:  # one Linear: nothing for tp to split
        tp = 1
    mode = rng.choice(["fsdp", "fsdp", "fsdp", "replicate"])
    par = {"backend": "local", "ranks": str(dp * tp), "tp": str(tp), "mode": mode,
           "sync_module_states": rng.choice(["false", "true"]), "timeout_s": "120"}
    if mode == "fsdp":
        strategy = rng.choice(["full_shard", "shard_grad_op", "no_shard"] +
                              (["hybrid_shard"] if dp >= 2 else []))  # it needs 2 dp ranks
        par["strategy"] = strategy
        par["offload"] = rng.choice(["false", "true"])
        par["use_orig_params"] = rng.choice(["false", "true"])
        if len(widths) > 2:
            par["wrap"] = rng.choice(["none", "layer"])
        if strategy == "hybrid_shard":
            par["replicas"] = str(rng.choice([0] + [d for d in range(1, dp + 1) if dp % d == 0]))
    momentum = rng.choice([0.0, 0.5, 0.9])
    samples = rng.randint(1, 40)
    teacher = [rng.randint(1, 12) for _ in range(rng.randint(0, 2))]
    steps = rng.randint(1, 6)
    optim = {"name": rng.choice(["sgd", "sgd", "adam", "adamw"]),
             "lr": rng.choice(["0.01", "0.05", "0.1"]),
             "weight_decay": rng.choice(["0", "0", "0.01"]),
             "clip_grad_norm": rng.choice(["0", "0", "0.5"]),
             "schedule": rng.choice(["constant", "warmup", "cosine"])}
    if optim["name"] == "sgd":
        optim["momentum"] = str(momentum)
        optim["nesterov"] = "true" if momentum > 0 and rng.random() < 0.3 else "false"
    else:
        optim["lr"] = rng.choice(["0.001", "0.01"])
        optim["betas"] = rng.choice(["0.9,0.999", "0.8,0.99"])
    if optim["schedule"] != "constant":
        optim["warmup_steps"] = str(rng.randint(0, steps - 1))
    if optim["schedule"] == "cosine":
        optim["min_lr"] = "0.0001"
    return {
        "model": {"widths": ",".join(map(str, widths)),
                  "activation": rng.choice(["relu", "gelu", "sigmoid"])},
        "parallel": par,
        "data": {"samples": str(samples), "batch_size": str(rng.randint(dp, 12)),
                 "seed": str(rng.randint(0, 10**6)), "teacher_widths": ",".join(map(str, teacher)),
                 "noise": rng.choice(["0", "0", "0.1"]),
                 "shuffle": rng.choice(["false", "true"])},
        "optim": optim,
        "train": {"steps": str(steps), "seed": str(rng.randint(0, 10**6)), "log_every": "1"},
        "log": {"level": "warn"},
    }


def one_rank(cfg):
    """The same model and data on one rank, no parallelism."""
    ref = {s: dict(kv) for s, kv in cfg.items()}
    ref["parallel"] = {"backend": "local", "ranks": "1", "tp": "1", "timeout_s": "120"}
    return ref


def ini_text(cfg):
    return "".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items())
                   for s, kv in cfg.items())


def run(exe, cfg, path, timeout):
    """Runs fsdp-train on cfg; returns (ok, losses or message)."""
    metrics = path + ".jsonl"
    cfg = {s: dict(kv) for s, kv in cfg.items()}
    cfg["log"]["metrics"] = metrics
    with open(path, "w") as f:
        f.write(ini_text(cfg))
    if os.path.exists(metrics):
        os.remove(metrics)
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    try:
        p = subprocess.run([exe, "--config", path, "--set", "log.level=info"], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s"
    out = p.stdout + p.stderr
    if any(m in out for m in SANITIZER_MARKS):
        return False, "sanitizer report:\n" + out[-4000:]
    if p.returncode != 0:
        return False, f"exit status {p.returncode}:\n" + out[-2000:]
    m = re.search(r"whole-dataset loss ([0-9.e+-]+) -> ([0-9.e+-]+)", out)
    with open(metrics) as f:
        steps = [json.loads(line)["loss"] for line in f if line.strip()]
    if not m:
        return False, "no whole-dataset losses in the output:\n" + out[-2000:]
    return True, {"steps": steps, "first": float(m.group(1)), "last": float(m.group(2))}


def compare(got, want):
    """The largest |got - want| / (RTOL |want| + ATOL first) (<= 1 passes) and its relative diff."""
    scale = abs(want["first"])
    pairs = list(zip(got["steps"], want["steps"]))
    worst, worst_rel = 0.0, 0.0
    if len(got["steps"]) != len(want["steps"]):
        return float("inf"), float("inf")
    for g, w in pairs:
        d = abs(g - w)
        worst = max(worst, d / (RTOL * abs(w) + ATOL * scale))
        worst_rel = max(worst_rel, d / max(abs(w), 1e-30))
    for key in ("first", "last"):  # printed with 6 decimals: 1e-6 more for that rounding
        d = abs(got[key] - want[key])
        worst = max(worst, d / (RTOL * abs(want[key]) + ATOL * scale + 1e-6))
    return worst, worst_rel


def check(args, index, seed, tmp):
    rng = random.Random(seed)
    cfg = random_config(rng)
    base = os.path.join(tmp, f"config-{index:04d}")
    ok, got = run(args.exe, cfg, base + ".ini", args.timeout)
    if ok:
        ok_ref, want = run(args.exe, one_rank(cfg), base + "-ref.ini", args.timeout)
        if not ok_ref:
            ok, got = False, "the single-rank run failed: " + want
    if not ok:
        return index, cfg, False, got, 0.0
    worst, worst_rel = compare(got, want)
    if worst > 1:
        msg = (f"losses differ beyond rtol {RTOL} + atol {ATOL} x first loss: "
               f"layout {got}, one rank {want}")
        return index, cfg, False, msg, worst_rel
    return index, cfg, True, "", worst_rel


def layout_text(cfg):
    p = cfg["parallel"]
    text = f"ranks {p['ranks']} tp {p['tp']} {p['mode']}"
    for k in ("strategy", "wrap", "offload", "use_orig_params", "replicas", "sync_module_states"):
        if k in p and p[k] not in ("false", "none"):
            text += f" {k}={p[k]}" if k not in ("strategy",) else f" {p[k]}"
    return text + f" widths {cfg['model']['widths']} batch {cfg['data']['batch_size']}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exe", default="build-asan/fsdp-train", help="fsdp-train to run")
    ap.add_argument("--count", type=int, default=300, help="configurations to run")
    ap.add_argument("--seed", type=int, default=1, help="seed of the first configuration")
    ap.add_argument("--jobs", type=int, default=2, help="configurations run at once")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per fsdp-train run")
    ap.add_argument("--keep", default="", help="directory to keep failing configurations in")
    ap.add_argument("--verbose", action="store_true", help="a line per configuration")
    args = ap.parse_args()
    if not os.access(args.exe, os.X_OK):
        sys.exit(f"config_fuzz.py: {args.exe} is not an executable; build it first "
                 f"(make fuzz-config builds the sanitizer build) or pass --exe")
    t0 = time.time()
    failures, worst_rel, layouts = [], 0.0, {}
    with tempfile.TemporaryDirectory(prefix="fsdp-fuzz-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(check, args, i, args.seed * 1000003 + i, tmp)
                   for i in range(args.count)]
        for fut in concurrent.futures.as_completed(futures):
            index, cfg, ok, msg, rel = fut.result()
            worst_rel = max(worst_rel, rel)
            key = (cfg["parallel"]["mode"], cfg["parallel"].get("strategy", ""))
            layouts[key] = layouts.get(key, 0) + 1
            if args.verbose or not ok:
                print(f"config {index:4d}: {'ok  ' if ok else 'FAIL'} rel {rel:.1e}  "
                      f"{layout_text(cfg)}", flush=True)
            if not ok:
                print(ini_text(cfg) + msg + "\n", flush=True)
                failures.append(index)
                if args.keep:
                    os.makedirs(args.keep, exist_ok=True)
                    with open(os.path.join(args.keep, f"config-{index:04d}.ini"), "w") as f:
                        f.write(ini_text(cfg))
    mix = ", ".join(f"{m}{'/' + s if s else ''} {n}" for (m, s), n in sorted(layouts.items()))
    print(f"config_fuzz: {args.count - len(failures)}/{args.count} configurations match one rank "
          f"(seed {args.seed}; {mix}); worst relative step-loss difference {worst_rel:.1e}; "
          f"{time.time() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
