#!/usr/bin/env bash
# The GPU check: run it first whenever a machine with a real GPU is at hand, and record what it
# prints in the README's Speed section. It prints the adapters, the train step on GPU:0 (time,
# host time, dispatches) with the GPU kernels and with the software adapters' kernels, the
# profiler's top ops and kernels, and the kernel benchmarks on GPU:0 in quick mode.
#
#   scripts/gpu_check.sh              # builds with cargo first
#   scripts/gpu_check.sh BIN_DIR      # uses binaries built beforehand (scripts/gpu_pack.sh)
#
# GPU_CHECK_STEPS (default 30) sets the timed train steps; GPU_CHECK_BENCH=0 skips the kernel
# benchmarks; the profiles (trace.json, top_ops.txt) go under GPU_CHECK_OUT (default
# runs/gpu_check). Keep it under 8 minutes on any GPU: the device time of a lent machine is short.
set -u

bin=${1:-}
if [ -z "$bin" ]; then
    cargo build --release --example fashion_mnist --example device_info || exit 1
    cargo bench --no-run --bench kernels || exit 1
    bin=target/release/examples
    kernels=$(ls -t target/release/deps/kernels-* | grep -v '\.d$' | head -1)
else
    kernels=$bin/kernels
fi
steps=${GPU_CHECK_STEPS:-30}
out=${GPU_CHECK_OUT:-runs/gpu_check}

section() { printf '\n=== %s (%s)\n' "$*" "$(date +%T)"; }

section "adapters"
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$bin/device_info"

for batch in 128 1024; do
    for class in gpu software; do
        section "train step, GPU:0, batch $batch, $class kernels"
        ANYGPU_KERNEL_CLASS=$class timeout 90 "$bin/fashion_mnist" --device gpu:0 \
            --batch-size "$batch" --time-steps "$steps" --profile "$out/profile-$batch-$class" |
            sed -n '/^median train step/,$p'
    done
done

if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
    section "kernels, GPU:0 (criterion, quick)"
    ANYGPU_BENCH_DEVICES=gpu0 timeout 150 "$kernels" --bench --quick --noplot 2>&1 |
        grep -E '^[a-z0-9_]+/|time:|thrpt:'
fi
section "done"
