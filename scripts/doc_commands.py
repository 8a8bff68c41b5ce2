#!/usr/bin/env python3
"""Checks the commands the README and docs/ show, where they can run here.

Every `fashion_mnist` invocation in a code block (after `cargo run ... --example fashion_mnist
--`, or the built binary, possibly behind `mpirun`) runs with `--dry-run`: its flags must parse
and pass the example's checks. Every `--example`, `--bin` and `--bench` named must exist, and
every `scripts/...` file. The rest (training runs, mpirun, TensorBoard, pip) is what CI and the
tests run in full elsewhere, or needs what CI does not have.

    python3 scripts/doc_commands.py [FASHION_MNIST_BINARY]

The binary defaults to target/release/examples/fashion_mnist (built first when missing).
"""

import glob
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "examples/fashion_mnist/README.md"] + sorted(glob.glob("docs/*.md"))


def commands(path):
    """(line number, command) of every command line in the file's code blocks, with
    backslash continuations joined and comments dropped."""
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    out = []
    for block in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S):
        start = text[: block.start()].count("\n") + 2
        pending, first = "", None
        for i, line in enumerate(block.group(1).splitlines()):
            if first is None:
                first = start + i
            pending += line.rstrip("\\").strip() + " "
            if line.endswith("\\"):
                continue
            command = pending.split(" #")[0].strip()
            if command and not command.startswith("#"):
                out.append((first, command))
            pending, first = "", None
    return out


def example_args(command):
    """The fashion_mnist arguments of a command that runs it, else None."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for i, w in enumerate(words):
        if w == "fashion_mnist" and i > 0 and words[i - 1] == "--example":
            rest = words[i + 1 :]
            rest = rest[rest.index("--") + 1 :] if "--" in rest else []
        elif w.endswith("examples/fashion_mnist"):
            rest = words[i + 1 :]
        else:
            continue
        # The command ends at a shell operator (`&`, `|`, `;`, `&&`, a redirection).
        for j, a in enumerate(rest):
            if a in ("&", "|", ";", "&&", "||") or a.startswith(">"):
                return rest[:j]
        return rest
    return None


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/examples/fashion_mnist")
    if not os.path.exists(binary):
        subprocess.run(["cargo", "build", "--release", "--example", "fashion_mnist"], cwd=ROOT, check=True)
    cargo = open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8").read()
    failures, checked = [], 0
    for doc in DOCS:
        for line, command in commands(doc):
            where = f"{doc}:{line}: {command}"
            for kind, name in re.findall(r"--(example|bin|bench) ([\w-]+)", command):
                exists = {
                    "example": os.path.exists(os.path.join(ROOT, "examples", name))
                    or os.path.exists(os.path.join(ROOT, "examples", name + ".rs")),
                    "bin": f'name = "{name}"' in cargo,
                    "bench": os.path.exists(os.path.join(ROOT, "benches", name + ".rs")),
                }[kind]
                checked += 1
                if not exists:
                    failures.append(f"{where}\n    no {kind} named {name}")
            for script in re.findall(r"(?<![\w/])scripts/[\w./-]+", command):
                checked += 1
                if not os.path.exists(os.path.join(ROOT, script)):
                    failures.append(f"{where}\n    no file {script}")
            args = example_args(command)
            if args is None:
                continue
            # Placeholders a reader fills in are not flags to check.
            if any(re.search(r"[<>\[\]]", a) for a in args):
                continue
            run = subprocess.run([binary, *args, "--dry-run"], cwd=ROOT, capture_output=True, text=True)
            checked += 1
            if run.returncode != 0:
                failures.append(f"{where}\n    fashion_mnist {' '.join(args)} --dry-run: {run.stderr.strip()}")
    for f in failures:
        print(f"FAILED {f}")
    print(f"{checked} checks of the commands in {len(DOCS)} files, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
