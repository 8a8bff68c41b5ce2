#!/usr/bin/env bash
# The GPU check: run it first whenever a machine with a real GPU is at hand, and record what it
# prints in the README's Speed section. It prints the adapters; the train step on GPU:0 (time,
# host time, dispatches) with the heuristic kernels (ANYGPU_AUTOTUNE=off), with tuning from a
# cold cache (the first step pays it) and from the warm cache, with the tuner's decisions and
# the profiler's top ops and kernels; Burn's step on the same GPU when its binary is there;
# and the kernel benchmarks on GPU:0 in quick mode.
#
#   scripts/gpu_check.sh              # builds with cargo first
#   scripts/gpu_check.sh BIN_DIR      # uses binaries built beforehand (scripts/gpu_pack.sh)
#
# GPU_CHECK_STEPS (default 30) sets the timed train steps; GPU_CHECK_BENCH=0 skips the kernel
# benchmarks, GPU_CHECK_BURN=0 the peer; profiles (trace.json, top_ops.txt) and the tuning
# cache go under GPU_CHECK_OUT (default runs/gpu_check). Keep it under 8 minutes on any GPU: a
# lent machine's time is short (on an H200 it takes 4, Burn's cold autotune 2 of them).
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
mkdir -p "$out"
out=$(cd "$out" && pwd)

section() { printf '\n=== %s (%s)\n' "$*" "$(date +%T)"; }
ours() {
    timeout 120 "$bin/fashion_mnist" --device gpu:0 --time-steps "$steps" "$@" |
        sed -n '/^warm-up steps/,$p'
}
# The peer's wgpu-vulkan asks for a software adapter (lavapipe); elsewhere wgpu-auto takes the
# first GPU.
burn_backend=wgpu-auto
if ! command -v nvidia-smi >/dev/null; then burn_backend=wgpu-vulkan; fi
burn() {
    # Burn writes its autotune cache under XDG_CACHE_HOME and next to a Cargo.toml above it.
    (cd "$(mktemp -d)" && XDG_CACHE_HOME="$out/burn-cache" timeout 240 \
        "$bin/burn_peer" "$burn_backend" --warmup 3 --steps "$steps" --fwd-steps 1 2>&1 | tail -4)
}

section "adapters"
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$bin/device_info"

for batch in 128 1024; do
    section "train step, GPU:0, batch $batch, heuristic kernels (ANYGPU_AUTOTUNE=off)"
    ANYGPU_AUTOTUNE=off ours --batch-size "$batch"
    section "train step, GPU:0, batch $batch, tuning from a cold cache"
    rm -rf "$out/cache-$batch"
    ANYGPU_CACHE_DIR="$out/cache-$batch" ours --batch-size "$batch"
    section "train step, GPU:0, batch $batch, tuned (warm cache), profiled"
    ANYGPU_CACHE_DIR="$out/cache-$batch" ours --batch-size "$batch" --profile "$out/profile-$batch"
done

if [ -x "$bin/burn_peer" ] && [ "${GPU_CHECK_BURN:-1}" != 0 ]; then
    section "Burn 0.22 (wgpu, Vulkan), batch 128: cold autotune cache, then warm; ours between"
    rm -rf "$out/burn-cache"
    burn
    ANYGPU_CACHE_DIR="$out/cache-128" ours | grep '^median'
    burn
    ANYGPU_CACHE_DIR="$out/cache-128" ours | grep '^median'
fi

if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
    section "kernels, GPU:0 (criterion, quick; tuned, batch 128 cache)"
    ANYGPU_CACHE_DIR="$out/cache-128" ANYGPU_BENCH_DEVICES=gpu0 timeout 150 "$kernels" --bench --quick --noplot 2>&1 |
        grep -E '^[a-z0-9_]+/|time:'
fi
section "done"
