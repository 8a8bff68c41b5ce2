#!/usr/bin/env python3
"""Issue 24's targets, read off the table scripts/gpu_check.sh writes (one "<batch> <label> <ms>"
line per run): for each target the two sides, their ratio and "met" or "MISSED by N%".

    python3 scripts/gpu_verdict.py runs/gpu_check/medians.txt

A row run in several rounds counts with its median; a target whose rows are missing (a batch
size or a peer left out, a run that failed) is listed as not measured.
"""
import statistics
import sys
from collections import defaultdict

COLD_LIMIT_MS = 5000.0
BUSY_SLACK = 1.15


def read(path):
    runs = defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) != 3:
                continue
            batch, label, ms = parts
            try:
                value = float(ms)
            except ValueError:
                continue  # "failed"
            runs[(batch, label)].append(value)
    return {key: statistics.median(v) for key, v in runs.items()}


def verdict(ours, bound, what):
    if ours is None or bound is None:
        return f"{'not measured':<16}{what}"
    ratio = ours / bound
    result = "met" if ratio <= 1.0 else f"MISSED by {100 * (ratio - 1):.0f}%"
    return f"{result:<16}{what}: {ours:.2f} against {bound:.2f} ms ({ratio:.2f}x)"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    m = read(sys.argv[1])
    row = lambda batch, label: m.get((batch, label))
    half = lambda v: None if v is None else 0.5 * v
    slack = lambda v: None if v is None else BUSY_SLACK * v
    lines = [
        verdict(row("1024", "anygpu-f32"), row("1024", "torch-fp32-eager(TF32-off)"),
                "batch 1024, f32 step <= PyTorch fp32 eager (TF32 off)"),
        verdict(row("1024", "anygpu-mixed_float16"), row("1024", "torch-amp-fp16"),
                "batch 1024, mixed step <= PyTorch AMP eager"),
        verdict(row("1024", "anygpu-mixed_float16"), half(row("1024", "anygpu-f32")),
                "batch 1024, mixed step <= 0.5x our f32 step"),
        verdict(row("128", "anygpu-f32"), row("128", "torch-fp32-eager(TF32-off)"),
                "batch 128, f32 step <= PyTorch fp32 eager (TF32 off)"),
        verdict(row("128", "anygpu-f32"), row("128", "torch-default-eager"),
                "batch 128, f32 step <= PyTorch eager with its defaults"),
    ]
    for precision in ("f32", "mixed_float16"):
        kernels = slack(row("128", f"anygpu-{precision}:kernels"))
        for step, how in (("", "waiting after each step"), (":b2b", "back to back")):
            lines.append(verdict(row("128", f"anygpu-{precision}{step}"), kernels,
                                 f"batch 128, {precision} step ({how}) <= 1.15x its kernels' busy time"))
    for (batch, label), ms in sorted(m.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
        if label.endswith(":cold"):
            lines.append(verdict(ms, COLD_LIMIT_MS,
                                 f"batch {batch}, {label[:-5]} cold first step (tuning included) <= 5 s"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
