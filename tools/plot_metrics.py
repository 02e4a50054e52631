#!/usr/bin/env python3
"""plot_metrics.py: fsdp-train's metrics files ([log] metrics, JSON lines) as one PNG.

One panel per quantity the files hold: the training loss with the held-out loss
("loss", "eval_loss"), held-out accuracy ("eval_accuracy"), the learning rate ("lr"), the
gradient norm before clipping ("grad_norm", written with [optim] clip_grad_norm) and the
throughput ("tokens_per_s" for token data, else "samples_per_s"). Panels whose keys no file
holds are left out. Each file is one run, one colour, named in the legend by its directory.

The x axis (--x):
  step    the step of each record (default);
  time    seconds of training ("time_s"; a resumed run's clock continues where the file's
          previous segment ended);
  tokens  tokens trained: step x --tokens-per-step (batch_size x max_seq_len) when given, else
          estimated as the sum of tokens_per_s x the seconds between records.

A file that is appended to by a later run (fsdp-train appends) holds several runs: a record whose
step is not above the last one kept replaces the records from its step on, so the plot shows the
latest run, resumed runs joined. Needs matplotlib (pip install matplotlib).

    python3 tools/plot_metrics.py runs/digits/metrics.jsonl --out loss.png
    python3 tools/plot_metrics.py runs/a/metrics.jsonl runs/b/metrics.jsonl --x time --out ab.png
"""
import argparse
import json
import math
import os
import sys

# (panel title, keys drawn in it, y label, log scale)
PANELS = [
    ("loss", ["loss", "eval_loss"], "loss", True),
    ("held-out accuracy", ["eval_accuracy"], "accuracy", False),
    ("learning rate", ["lr"], "lr", False),
    ("gradient norm (before clipping)", ["grad_norm"], "norm", True),
    ("throughput", ["tokens_per_s", "samples_per_s"], "per second", False),
]
LABELS = {"loss": "train", "eval_loss": "held-out", "tokens_per_s": "tokens/s",
          "samples_per_s": "samples/s"}


class MetricsError(Exception):
    """A file that cannot be plotted; the message names the file (and line) and the fix."""


def read_metrics(path):
    """The records of one metrics file, in order, the latest run's (see the module doc).

    Each record is a dict with an int "step"; a malformed line raises MetricsError naming
    path:line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise MetricsError(f"cannot read metrics file {path}: {e.strerror}; give the file "
                           "fsdp-train's [log] metrics names") from None
    except UnicodeDecodeError as e:
        raise MetricsError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}): not a "
                           "metrics file") from None
    kept = []
    offset, last_time = 0.0, None  # time_s restarts with each run that appends to the file
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise MetricsError(f"{path}:{n}: not a JSON line ({e.msg} at column {e.colno}); "
                               "each line of a metrics file is one JSON object: remove or "
                               "repair the line (a run killed mid-write can cut its last "
                               "line)") from None
        if not isinstance(rec, dict):
            raise MetricsError(f"{path}:{n}: a JSON {type(rec).__name__}, not an object "
                               "with a \"step\"; not a metrics file of fsdp-train")
        step = rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise MetricsError(f"{path}:{n}: no non-negative integer \"step\" (got {step!r}); "
                               "not a metrics record of fsdp-train")
        for k, v in rec.items():
            if k != "step" and (isinstance(v, bool) or not isinstance(v, (int, float, dict))):
                raise MetricsError(f"{path}:{n}: \"{k}\" is {v!r}, not a number")
        t = rec.get("time_s")
        if isinstance(t, (int, float)):
            if last_time is not None and t < last_time - offset:
                offset = last_time  # a new run's clock: continue where the last one ended
            rec["_time"] = t + offset
            last_time = rec["_time"]
        while kept and kept[-1]["step"] >= step:
            kept.pop()
        kept.append(rec)
    if not kept:
        raise MetricsError(f"{path} holds no records; train with [log] metrics set (and "
                           "train.log_every > 0) to fill it")
    return kept


def x_values(path, recs, x, tokens_per_step):
    """The x coordinate of each record, or MetricsError when the file lacks what x needs."""
    if x == "step":
        return [r["step"] for r in recs]
    if x == "time":
        if not any("_time" in r for r in recs):
            raise MetricsError(f"{path} has no \"time_s\": --x time needs the progress "
                               "records' time; use --x step")
        return [r.get("_time", math.nan) for r in recs]
    if tokens_per_step:
        return [r["step"] * tokens_per_step for r in recs]
    if not any("tokens_per_s" in r and "_time" in r for r in recs):
        raise MetricsError(f"{path} has no \"tokens_per_s\" with \"time_s\" (only token data "
                           "writes them), which --x tokens needs without --tokens-per-step; give "
                           "--tokens-per-step (batch_size x max_seq_len), or use --x step")
    xs, total, prev = [], 0.0, 0.0
    for r in recs:
        if "tokens_per_s" in r and "_time" in r:
            total += r["tokens_per_s"] * max(r["_time"] - prev, 0.0)
            prev = r["_time"]
        xs.append(total if "tokens_per_s" in r else math.nan)
    return xs


def plot(runs, x, out, title, paths):
    """runs: [(label, xs, records)] of the files paths. Writes the PNG; returns the panels drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MetricsError("plot_metrics.py needs matplotlib: pip install matplotlib") from None
    panels = [p for p in PANELS if any(k in r for _, _, recs in runs for r in recs for k in p[1])]
    if not panels:
        keys = sorted({k for _, _, recs in runs for r in recs for k in r if k[0] != "_"})
        plottable = sorted({k for p in PANELS for k in p[1]})
        raise MetricsError(f"no plottable key in {', '.join(paths)}: the records "
                           f"hold {', '.join(keys)}; plottable are {', '.join(plottable)}")
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.0 * rows), squeeze=False)
    xlabel = {"step": "step", "time": "seconds", "tokens": "tokens"}[x]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, keys, ylabel, log) in zip(axes.flat, panels):
        for i, (label, xs, recs) in enumerate(runs):
            for key in keys:
                pts = [(xv, r[key]) for xv, r in zip(xs, recs)
                       if key in r and not math.isnan(xv) and math.isfinite(r[key])]
                if not pts:
                    continue
                parts = [label] if len(runs) > 1 else []
                if len(keys) > 1:
                    parts.append(LABELS.get(key, key))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colours[i % len(colours)],
                        linestyle="--" if key.startswith("eval_") else "-",
                        marker="o" if len(pts) < 30 else None,
                        markersize=3, label=", ".join(parts) or None)
        if log and all(r[k] > 0 for _, _, recs in runs for r in recs for k in keys if k in r):
            ax.set_yscale("log")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=80)
    except OSError as e:
        raise MetricsError(f"cannot write {out}: {e.strerror}") from None
    finally:
        plt.close(fig)
    return [p[0] for p in panels]


def run_label(path, paths):
    """The run's directory ("runs/digits"), or the file name when the directories repeat."""
    d = os.path.dirname(os.path.normpath(path)) or "."
    dirs = [os.path.dirname(os.path.normpath(p)) or "." for p in paths]
    return d if dirs.count(d) == 1 else os.path.normpath(path)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="metrics.jsonl files, one per run")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--x", choices=["step", "time", "tokens"], default="step",
                    help="the x axis (default: step)")
    ap.add_argument("--tokens-per-step", type=int, default=0,
                    help="with --x tokens: tokens per step (batch_size x max_seq_len), exact "
                         "instead of estimated from tokens_per_s")
    ap.add_argument("--title", default="", help="a title over the panels")
    args = ap.parse_args(argv)
    if args.tokens_per_step < 0:
        ap.error("--tokens-per-step must be positive")
    try:
        runs = []
        for p in args.files:
            recs = read_metrics(p)
            runs.append((run_label(p, args.files), x_values(p, recs, args.x,
                                                            args.tokens_per_step), recs))
        panels = plot(runs, args.x, args.out, args.title, args.files)
    except MetricsError as e:
        print(f"plot_metrics.py: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {', '.join(panels)} of {len(runs)} run{'s' * (len(runs) > 1)} "
          f"({sum(len(r) for _, _, r in runs)} records) over {args.x}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
