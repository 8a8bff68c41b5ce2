#!/usr/bin/env python3
"""Issue 24's targets, read off the table scripts/gpu_check.sh writes (one "<batch> <label> <ms>"
line per run): for each target the two sides, their ratio and "met" or "MISSED by N%".

    python3 scripts/gpu_verdict.py runs/gpu_check/medians.txt

A row run in several rounds counts with its median. A target whose run failed (its row reads
"failed", or "skipped" when the check ran out of time) is listed as FAILED (or skipped) with
the row; one whose rows are missing (a batch size or a peer left out) as not measured.
"""
import statistics
import sys
from collections import defaultdict

COLD_LIMIT_MS = 5000.0
BUSY_SLACK = 1.15


def read(path):
    """The median of each (batch, label) that has numbers, and what the others say instead."""
    runs = defaultdict(list)
    others = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) != 3:
                continue
            batch, label, ms = parts
            try:
                value = float(ms)
            except ValueError:
                others[(batch, label)] = ms  # "failed", "skipped"
                continue
            runs[(batch, label)].append(value)
    medians = {key: statistics.median(v) for key, v in runs.items()}
    return medians, {key: why for key, why in others.items() if key not in medians}


class Table:
    def __init__(self, path):
        self.medians, self.others = read(path)

    def side(self, batch, label, scale=1.0):
        """(milliseconds or None, why it is missing or None)."""
        key = (batch, label)
        if key in self.medians:
            return self.medians[key] * scale, None
        why = self.others.get(key)
        return None, (f"{label} at batch {batch}: {why}" if why else None)


def verdict(ours, bound, what):
    (mine, my_why), (theirs, their_why) = ours, bound
    if mine is None or theirs is None:
        whys = [w for w in (my_why, their_why) if w]
        if not whys:
            return f"{'not measured':<16}{what}"
        word = "skipped" if all(w.endswith("skipped") for w in whys) else "FAILED"
        return f"{word:<16}{what}: {'; '.join(whys)}"
    ratio = mine / theirs
    result = "met" if ratio <= 1.0 else f"MISSED by {100 * (ratio - 1):.0f}%"
    return f"{result:<16}{what}: {mine:.2f} against {theirs:.2f} ms ({ratio:.2f}x)"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    t = Table(sys.argv[1])
    lines = [
        verdict(t.side("1024", "anygpu-f32"), t.side("1024", "torch-fp32-eager(TF32-off)"),
                "batch 1024, f32 step <= PyTorch fp32 eager (TF32 off)"),
        verdict(t.side("1024", "anygpu-mixed_float16"), t.side("1024", "torch-amp-fp16"),
                "batch 1024, mixed step <= PyTorch AMP eager"),
        verdict(t.side("1024", "anygpu-mixed_float16"), t.side("1024", "anygpu-f32", 0.5),
                "batch 1024, mixed step <= 0.5x our f32 step"),
        verdict(t.side("128", "anygpu-f32"), t.side("128", "torch-fp32-eager(TF32-off)"),
                "batch 128, f32 step <= PyTorch fp32 eager (TF32 off)"),
        verdict(t.side("128", "anygpu-f32"), t.side("128", "torch-default-eager"),
                "batch 128, f32 step <= PyTorch eager with its defaults"),
    ]
    for precision in ("f32", "mixed_float16"):
        kernels = t.side("128", f"anygpu-{precision}:kernels", BUSY_SLACK)
        for step, how in (("", "waiting after each step"), (":b2b", "back to back")):
            lines.append(verdict(t.side("128", f"anygpu-{precision}{step}"), kernels,
                                 f"batch 128, {precision} step ({how}) <= 1.15x its kernels' busy time"))
    cold = sorted({key for key in [*t.medians, *t.others] if key[1].endswith(":cold")},
                  key=lambda key: (int(key[0]), key[1]))
    for batch, label in cold:
        lines.append(verdict(t.side(batch, label), (COLD_LIMIT_MS, None),
                             f"batch {batch}, {label[:-5]} cold first step (tuning included) <= 5 s"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
