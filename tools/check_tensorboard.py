#!/usr/bin/env python3
"""check_tensorboard.py: fsdp-train's TensorBoard event files read by TensorBoard itself.

Runs the driver (tests/tb_driver.c, tools/train_tensorboard.c) into a temporary directory and
reads the file it wrote with the tensorboard package: the raw events through
`event_file_loader.EventFileLoader` (which checks every record's CRCs: the first event's
file_version must be "brain.Event:2") and the scalars through `EventAccumulator`: the tags
"train/loss", "lr" and "eval/loss" with the driver's steps and values (float32, compared bit
for bit after rounding the expected doubles to float32). Exits 77 (skipped) when tensorboard is
not installed (pip install tensorboard).

With --train FSDP_TRAIN --config INI it also runs fsdp-train (30 steps with [log] tensorboard
and metrics, an evaluation every 15) and reads the event file it wrote: the scalars of every
tag must be those of the metrics records' keys (loss -> train/loss, eval_loss -> eval/loss,
...) at the same steps, each within float32 rounding (2^-24 relative) of the record's value
plus the record's text rounding (%.9g: 5e-9 relative; the throughput's %.1f: 0.05).

    python3 tools/check_tensorboard.py --driver build/tests/tb_driver \
        [--train build/fsdp-train --config examples/mlp.ini]
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile


def f32(x):
    """x rounded to float32, as TensorBoard's simple_value holds it."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--driver", required=True, help="the tb_driver executable")
    ap.add_argument("--train", help="the fsdp-train executable: check a run's event file too")
    ap.add_argument("--config", help="the configuration fsdp-train runs (with --train)")
    args = ap.parse_args()
    try:
        from tensorboard.backend.event_processing import event_accumulator, event_file_loader
    except ImportError as e:
        print(f"check_tensorboard.py: skipped: the tensorboard package is missing ({e}); "
              "pip install tensorboard")
        return 77
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([args.driver, d], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            print(f"check_tensorboard.py: the driver failed ({out.returncode}): {out.stderr}")
            return 1
        path = out.stdout.strip()
        if os.path.dirname(path) != d or not os.path.basename(path).startswith(
                "events.out.tfevents."):
            print(f"check_tensorboard.py: unexpected event file path {path!r}")
            return 1
        events = list(event_file_loader.EventFileLoader(path).Load())
        if not events or events[0].file_version != "brain.Event:2":
            print(f"check_tensorboard.py: the first event is not file_version brain.Event:2: "
                  f"{events[:1]}")
            return 1
        acc = event_accumulator.EventAccumulator(d)
        acc.Reload()
        want = {
            "train/loss": [(s, f32(4.0 / s)) for s in range(1, 51)],
            "lr": [(s - 1, f32(0.001 * s)) for s in range(1, 51)],
            "eval/loss": [(s, f32(3.0 / s + 0.25)) for s in range(10, 51, 10)],
        }
        tags = sorted(acc.Tags()["scalars"])
        if tags != sorted(want):
            print(f"check_tensorboard.py: scalar tags {tags}, want {sorted(want)}")
            return 1
        bad = 0
        for tag, points in want.items():
            got = [(e.step, e.value) for e in acc.Scalars(tag)]
            if got != points:
                print(f"check_tensorboard.py: {tag}: got {got[:4]}..., want {points[:4]}...")
                bad += 1
            walls = [e.wall_time for e in acc.Scalars(tag)]
            if walls != sorted(walls) or abs(walls[0] - events[0].wall_time) > 60:
                print(f"check_tensorboard.py: {tag}: wall times out of order or far off")
                bad += 1
        if bad:
            return 1
        n = sum(len(p) for p in want.values())
        print(f"check_tensorboard.py: {os.path.basename(path)}: {len(events)} events, "
              f"{n} scalars of {len(want)} tags read by TensorBoard as written")
    if args.train:
        return check_train(args, event_accumulator)
    return 0


TAGS = {"loss": "train/loss", "samples_per_s": "train/samples_per_s",
        "tokens_per_s": "train/tokens_per_s", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "eval_loss": "eval/loss", "eval_accuracy": "eval/accuracy",
        "eval_perplexity": "eval/perplexity"}


def check_train(args, event_accumulator):
    """fsdp-train's event file against its metrics file, read by TensorBoard."""
    if not args.config:
        print("check_tensorboard.py: --train needs --config")
        return 2
    with tempfile.TemporaryDirectory() as d:
        sets = ["train.steps=30", "train.log_every=10", "train.eval_every=15",
                "data.eval_fraction=0.25", "optim.clip_grad_norm=1", "checkpoint.dir=",
                "log.level=warn", f"log.metrics={d}/metrics.jsonl", f"log.tensorboard={d}/tb"]
        cmd = [os.path.abspath(args.train), "--config", os.path.abspath(args.config)]
        for a in sets:
            cmd += ["--set", a]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=d)
        if out.returncode != 0:
            print(f"check_tensorboard.py: fsdp-train failed ({out.returncode}): {out.stderr}")
            return 1
        want = {}
        with open(os.path.join(d, "metrics.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                for key, tag in TAGS.items():
                    if key in rec:
                        want.setdefault(tag, []).append((rec["step"], rec[key], key))
        acc = event_accumulator.EventAccumulator(os.path.join(d, "tb"))
        acc.Reload()
        tags = sorted(acc.Tags()["scalars"])
        if tags != sorted(want):
            print(f"check_tensorboard.py: fsdp-train's scalar tags {tags}, want {sorted(want)}")
            return 1
        bad = 0
        for tag, points in want.items():
            got = [(e.step, e.value) for e in acc.Scalars(tag)]
            if [s for s, _ in got] != [s for s, _, _ in points]:
                print(f"check_tensorboard.py: {tag}: steps {[s for s, _ in got]}, want "
                      f"{[s for s, _, _ in points]}")
                bad += 1
                continue
            for (step, value), (_, w, key) in zip(got, points):
                text = 0.05 if key.endswith("_per_s") else 5e-9 * abs(w)
                if abs(value - w) > text + 2.0**-24 * abs(w):
                    print(f"check_tensorboard.py: {tag} at step {step}: {value}, want {w}")
                    bad += 1
        if bad:
            return 1
        print(f"check_tensorboard.py: fsdp-train's event file: {sum(map(len, want.values()))} "
              f"scalars of {len(want)} tags as its metrics records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
