#!/usr/bin/env python3
"""check_plot_metrics.py: tools/plot_metrics.py on generated metrics files (the keys fsdp-train
writes: see tools/trainer.c's report()).

Two runs (one of token data with tokens_per_s, one of samples with eval_accuracy, the second
appended to by a resumed run whose clock restarts) are drawn over step, time and tokens; each
PNG must start with the PNG signature, be non-empty, decode (matplotlib's imread, and Pillow
where installed) to the figure's size, and not be one flat colour. The refusals: a missing
file, a malformed line (its line number), a record without a step, no plottable key, --x
tokens on data without tokens_per_s: exit 1 with the message. The resumed file keeps the later
run's records. Exits 77 (skipped) without matplotlib.

    python3 tests/check_plot_metrics.py [--tool tools/plot_metrics.py]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_jsonl(path, records, extra_lines=()):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")


def token_run(steps):
    recs = []
    for s in range(10, steps + 1, 10):
        r = {"step": s, "loss": 5.0 / (1 + s / 50), "samples_per_s": 100.0 + s,
             "time_s": s * 0.05, "tokens_per_s": 12800.0 + 128 * s, "lr": 1e-3 * min(1, s / 40),
             "grad_norm": 2.0 / (1 + s / 100), "compute_s": 0.4, "comm_s": 0.1,
             "comm_calls": {"all_gather": 4}, "comm_bytes": {"all_gather": 4096}}
        if s % 50 == 0:
            r.update(eval_loss=r["loss"] * 1.1, eval_perplexity=2.0)
        recs.append(r)
    return recs


def sample_run():
    recs = [{"step": s, "loss": 2.3 / s, "samples_per_s": 5e4, "time_s": 0.01 * s, "lr": 0.003,
             "eval_loss": 2.0 / s, "eval_accuracy": 1 - 1 / s} for s in range(1, 41)]
    # resumed at step 31 (its checkpoint) after a kill at 40: the clock restarts
    recs += [{"step": s, "loss": 1.0 / s, "samples_per_s": 4e4, "time_s": 0.01 * (s - 30),
              "lr": 0.002} for s in range(31, 61)]
    return recs


def run(tool, *args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True,
                          timeout=120)


def check_png(path, failures):
    import matplotlib.image
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(PNG_SIGNATURE) or len(data) < 1000:
        failures.append(f"{path}: not a PNG ({len(data)} bytes, starts {data[:8]!r})")
        return
    img = matplotlib.image.imread(path)
    h, w = img.shape[:2]
    if h < 200 or w < 300 or float(img.std()) == 0.0:
        failures.append(f"{path}: decodes to {w}x{h}, std {img.std()}: blank or tiny")
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        if im.size != (w, h):
            failures.append(f"{path}: Pillow reads {im.size}, matplotlib {w}x{h}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tool", default=os.path.join(HERE, "..", "tools", "plot_metrics.py"))
    args = ap.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("check_plot_metrics.py: skipped: matplotlib is missing (pip install matplotlib)")
        return 77
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.tool)))
    import plot_metrics

    failures = []
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(f"{d}/runs/llama")
        os.makedirs(f"{d}/runs/digits")
        tok, smp = f"{d}/runs/llama/metrics.jsonl", f"{d}/runs/digits/metrics.jsonl"
        write_jsonl(tok, token_run(200))
        write_jsonl(smp, sample_run(), extra_lines=[""])
        for x in ("step", "time", "tokens"):
            files = [tok] if x == "tokens" else [tok, smp]
            out = f"{d}/{x}.png"
            r = run(args.tool, *files, "--out", out, "--x", x, "--title", f"over {x}")
            if r.returncode != 0:
                failures.append(f"--x {x}: exit {r.returncode}: {r.stderr}")
                continue
            check_png(out, failures)
            print(r.stdout.strip())
        r = run(args.tool, smp, "--out", f"{d}/exact.png", "--x", "tokens",
                "--tokens-per-step", "512")
        if r.returncode != 0:
            failures.append(f"--tokens-per-step: exit {r.returncode}: {r.stderr}")
        else:
            check_png(f"{d}/exact.png", failures)

        # the resumed run: steps 1..30 of the first run, then the second's 31..60, in order,
        # its clock continuing from the first run's last record (0.40 s)
        recs = plot_metrics.read_metrics(smp)
        steps = [r["step"] for r in recs]
        if steps != list(range(1, 61)) or recs[30]["loss"] != 1.0 / 31:
            failures.append(f"resumed file: steps {steps[:3]}...{steps[-3:]}, "
                            f"step 31 loss {recs[30]['loss']}")
        if abs(recs[30]["_time"] - 0.41) > 1e-9:
            failures.append(f"resumed file: step 31 at {recs[30]['_time']} s, want 0.41")
        xs = plot_metrics.x_values(tok, plot_metrics.read_metrics(tok), "tokens", 0)
        want = sum((12800.0 + 128 * s) * 0.5 for s in range(10, 201, 10))
        if abs(xs[-1] - want) > 1e-6 * want or xs != sorted(xs):
            failures.append(f"tokens axis: ends at {xs[-1]}, want {want}")

        bad = f"{d}/bad.jsonl"
        cases = [
            ([f"{d}/missing.jsonl"], "cannot read metrics file", "No such file"),
            ("malformed", "bad.jsonl:3: not a JSON line", "repair the line"),
            ("nostep", "bad.jsonl:1: no non-negative integer \"step\"", None),
            ("array", "bad.jsonl:1: a JSON list", None),
            ("string", "\"loss\" is 'low', not a number", None),
            ("empty", "holds no records", None),
            ("unplottable", "no plottable key", "plottable are eval_accuracy"),
            ("notokens", "--x tokens needs", None),
        ]
        contents = {
            "malformed": ['{"step": 1, "loss": 2.0}', '{"step": 2, "loss": 1.5}',
                          '{"step": 3, "lo'],
            "nostep": ['{"loss": 2.0}'],
            "array": ['[1, 2]'],
            "string": ['{"step": 1, "loss": "low"}'],
            "empty": ["", "  "],
            "unplottable": ['{"step": 1, "compute_s": 0.5, "comm_calls": {}}'],
            "notokens": ['{"step": 1, "loss": 2.0, "time_s": 0.1}'],
        }
        for files, want, want2 in cases:
            key = files if isinstance(files, str) else "missing"
            if key != "missing":
                with open(bad, "w") as f:
                    f.write("\n".join(contents[key]) + "\n")
                files = [bad]
            extra = ["--x", "tokens"] if key == "notokens" else []
            r = run(args.tool, *files, "--out", f"{d}/never.png", *extra)
            msg = r.stderr.strip()
            ok = r.returncode == 1 and want in msg and (want2 is None or want2 in msg)
            ok = ok and not os.path.exists(f"{d}/never.png")
            print(f"  {key}: exit {r.returncode}: {msg}")
            if not ok:
                failures.append(f"{key}: exit {r.returncode}, want 1 with '{want}': {msg}")
    for f in failures:
        print(f"FAIL: {f}")
    print(f"check_plot_metrics.py: {'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
