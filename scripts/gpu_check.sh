#!/usr/bin/env bash
# The GPU check: run it first whenever a machine with a real GPU is at hand, and record what it
# prints in the README's Speed section. It prints the adapters; the tensor-core
# (cooperative-matrix) products, the mixed-precision kernels and the float32 kernels (every
# tuning candidate forced) against the f64 oracle; the train step on GPU:0 from a cold tuning
# cache (the first step pays the tuning) and warm, profiled, in float32 and under
# mixed_float16; then ours, PyTorch's
# variants (scripts/torch_train_step.py) and Burn's side by side, alternating, at batch 128 and
# 1024, one table of their medians at the end, and each target of the GPU issue met or missed
# (scripts/gpu_verdict.py).
#
#   scripts/gpu_check.sh              # builds with cargo first
#   scripts/gpu_check.sh BIN_DIR      # uses binaries built beforehand (scripts/gpu_pack.sh)
#
# GPU_CHECK_STEPS (default 30) sets the timed train steps; GPU_CHECK_ROUNDS (default 2) the
# rounds of the side-by-side comparison; GPU_CHECK_BATCHES (default "128 1024") the batch sizes;
# GPU_CHECK_TORCH=0 skips PyTorch, GPU_CHECK_BURN=0 Burn, GPU_CHECK_COMPILE=0 torch.compile (the
# slowest PyTorch row: it compiles for a minute), GPU_CHECK_MODERN=0 the modern CNN's rows (our
# f32 and mixed_float16 steps and PyTorch's fp32 and AMP ones at batch GPU_CHECK_MODERN_BATCH,
# default 1024, after the comparison); GPU_CHECK_BENCH=1 adds the kernel benchmarks (criterion, quick). Profiles (trace.json, top_ops.txt) and the tuning caches go under
# GPU_CHECK_OUT (default runs/gpu_check); GPU_CHECK_KEEP=DIR copies what a record needs into
# DIR, in three files (medians.txt, top_ops.txt: every profile's, choices.txt: every tuning
# cache's, and every candidate's time where the tuner measured), after each batch of the
# comparison and at the end: a lent machine returns only a
# few files. GPU_CHECK_BUDGET (default 400) is the check's own deadline in seconds: each run's
# timeout is cut to what is left of it, the optional runs (the extra cold run, the old
# batching, torch.compile, Burn, the benchmarks) are skipped when little is left, and the table
# and verdict are printed after each batch of the comparison, so a check that runs out of time
# still leaves them. A rehearsal on a software adapter (a few minutes):
#   GPU_CHECK_STEPS=3 GPU_CHECK_ROUNDS=1 GPU_CHECK_BATCHES=128 GPU_CHECK_MODERN_BATCH=64 scripts/gpu_check.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)

bin=${1:-}
# A machine with the NVIDIA driver but no Vulkan loader (some lent GPU machines): the loaders
# scripts/gpu_pack.sh packed beside the binaries, and the driver's own ICD file.
if [ -n "$bin" ] && ! ldconfig -p | grep -q 'libvulkan.so.1' && ls "$bin"/*.deb >/dev/null 2>&1; then
    for deb in "$bin"/*.deb; do dpkg -x "$deb" /; done
    ldconfig
    for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; do
        [ -f "$icd" ] && export VK_DRIVER_FILES="${VK_DRIVER_FILES:-$icd}"
    done
    for egl in /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json; do
        [ -f "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="${__EGL_VENDOR_LIBRARY_FILENAMES:-$egl}"
    done
fi
if [ -z "$bin" ]; then
    cargo build --release --example fashion_mnist --example device_info || exit 1
    . "$(dirname "$0")/cargo_executable.sh"
    mixed=$(executable cargo test --release --test mixed_precision) || exit 1
    coop=$(executable cargo test --release --test coop_matrix) || exit 1
    kernel_tests=$(executable cargo test --release --test kernels) || exit 1
    kernels=$(executable cargo bench --bench kernels) || exit 1
    bin=target/release/examples
else
    kernels=$bin/kernels
    kernel_tests=$bin/kernel_tests
    mixed=$bin/mixed_precision
    coop=$bin/coop_matrix
fi
# The budget counts from here, after any build.
SECONDS=0
steps=${GPU_CHECK_STEPS:-30}
batches=${GPU_CHECK_BATCHES:-128 1024}
rounds=${GPU_CHECK_ROUNDS:-2}
budget=${GPU_CHECK_BUDGET:-400}
keep=${GPU_CHECK_KEEP:-}
out=${GPU_CHECK_OUT:-runs/gpu_check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
table="$out/medians.txt"
: >"$table"
: >"$out/ours.log"
reported=-1

section() { printf '\n=== %s (%s, %d s in)\n' "$*" "$(date +%T)" "$SECONDS"; }
# Seconds a run may take: its own limit WANT, cut to what is left of the budget less a margin
# for the table; 0 when too little is left to start one.
allowed() {
    local want=$1 left=$((budget - SECONDS - 20))
    if [ "$left" -lt 10 ]; then
        echo 0
    elif [ "$left" -lt "$want" ]; then
        echo "$left"
    else
        echo "$want"
    fi
}
# Runs COMMAND under `timeout` with the limit `allowed` gives it (killed 10 s after, if it
# ignores the signal); exit 125, and says so, when the budget is spent.
limited() {
    local secs
    secs=$(allowed "$1")
    shift
    if [ "$secs" = 0 ]; then
        echo "skipped: the check's budget of $budget s is spent"
        return 125
    fi
    timeout -k 10 "$secs" "$@"
}
# Whether an optional run still fits: at least SECONDS (default 150) of the budget left.
fits() { [ $((budget - SECONDS)) -ge "${1:-150}" ]; }
# Sets `why` to what a table row says when its run gave no number ("skipped" when the budget
# was spent, else "failed"), from the run's exit status, and prints the end of a failed run's
# output LINES (when given), which says why.
explain() {
    local rc=$1 lines=$2
    if [ "$rc" = 125 ]; then
        why=skipped
        return
    fi
    why=failed
    echo "the run gave no number (exit $rc; 124: timed out)${lines:+; its last lines:}"
    [ -z "$lines" ] || echo "$lines" | tail -5
}
# Runs a test binary, keeping the lines that match PATTERN and what each failure said; says so
# when it reported no test result at all (a binary that is not the test it should be, or one
# that died before reporting).
oracle() {
    local pattern=$1
    shift
    local lines
    lines=$(ANYGPU_REQUIRE_ADAPTER=1 limited "$@" 2>&1)
    echo "$lines" | grep -E "$pattern"
    echo "$lines" | grep -A4 '^thread .* panicked' | grep -v '^note: run with'
    if ! echo "$lines" | grep -q '^test result'; then
        echo "no test result from: $*"
        echo "$lines" | tail -5
    fi
}
# Runs a command while nvidia-smi samples the SM clock every 100 ms, then prints "sm clock: min
# A, median B, max C MHz (N samples)": a step that waits for the host lets the clocks drop, and
# the same kernels then take twice as long (the H200 idles at 345 MHz, boosts to 1980).
clocks() {
    if ! command -v nvidia-smi >/dev/null; then
        "$@"
        return
    fi
    local log pid rc
    log=$(mktemp)
    nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits -lms 100 >"$log" 2>/dev/null &
    pid=$!
    "$@"
    rc=$?
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    # The whole run (start-up, at idle clocks, included), and its last second: the end of the
    # warm-up and the timed steps, which at batch 128 take a fraction of a second.
    grep -E '^[0-9]+$' "$log" | sort -n | awk '{ v[NR] = $1 } END {
        if (NR) printf "sm clock: min %d, median %d, max %d MHz (%d samples)\n", v[1], v[int((NR + 1) / 2)], v[NR], NR
    }'
    grep -E '^[0-9]+$' "$log" | tail -10 | sort -n | awk '{ v[NR] = $1 } END {
        if (NR) printf "sm clock, last second: min %d, median %d, max %d MHz\n", v[1], v[int((NR + 1) / 2)], v[NR]
    }'
    rm -f "$log"
    return "$rc"
}
# Our example, timed: its output from the warm-up on (the tuner's decisions, with every measured
# candidate's time, among it) and its log; both also go to ours.log, whose measured decisions
# GPU_CHECK_KEEP keeps.
ours() {
    limited 120 "$bin/fashion_mnist" --device gpu:0 --time-steps "$steps" "$@" \
        2> >(tee -a "$out/ours.log" >&2) | tee -a "$out/ours.log" |
        sed -n '/^skipped: /p; /^warm-up steps/,$p'
    return "${PIPESTATUS[0]}"
}
# Two rows of the table, "<batch> <label> <ms>" and "<batch> <label>:b2b <ms>", from a run's
# "median train step: X ms" line (a wait after every step) and its "back-to-back train step:
# Y ms" line (one wait after all of them, as a training loop runs).
row() {
    local label=$1
    shift
    # `explain` sets this function's own `why` (bash's scoping), never one a former row left.
    local lines rc ms b2b why=failed
    lines=$(clocks "$@" 2>&1)
    rc=$?
    echo "$lines" | grep -E '(median|back-to-back) train step|^sm clock|^skipped'
    ms=$(echo "$lines" | sed -n 's/.*median train step: \([0-9.]*\) ms.*/\1/p' | tail -1)
    b2b=$(echo "$lines" | sed -n 's/.*back-to-back train step: \([0-9.]*\) ms.*/\1/p' | tail -1)
    if [ -z "$ms" ]; then
        explain "$rc" "$lines"
        ms=$why
    fi
    echo "$label $ms" >>"$table"
    echo "$label:b2b ${b2b:-$why}" >>"$table"
}
# Runs a command, passed through, and adds "<batch> <label><suffix> <ms>" to the table, the ms
# read off its output by an awk program: record SUFFIX AWK_PROGRAM "<batch> <label>" COMMAND...
record() {
    local suffix=$1 program=$2 label=$3
    shift 3
    local lines rc ms why
    lines=$("$@" 2>&1)
    rc=$?
    echo "$lines"
    ms=$(echo "$lines" | awk "$program")
    if [ -z "$ms" ]; then
        # Its output is shown whole, just above.
        explain "$rc" ""
        ms=$why
    fi
    echo "$label$suffix $ms" >>"$table"
}
# A profiled run: the device time of its kernels per step (a step that keeps the GPU busy takes
# about that long).
busy() {
    record :kernels '
        /^profile of [0-9]+ train steps/ { steps = $3 }
        / kernels timed on a device, / { for (i = 1; i <= NF; i++) if ($i == "ms") total = $(i - 1) }
        END { if (steps && total != "") printf "%.2f", total / steps }' "$@"
}
# A run from a cold tuning cache: its first step (compiling and tuning included).
cold() {
    record :cold '/^warm-up steps: / { sub(",", "", $3); print $3; exit }' "$@"
}
# PyTorch's step: torch VARIANT [TIMEOUT [MODEL]], at $batch.
torch() {
    limited "${2:-90}" python3 "$here/torch_train_step.py" --variant "$1" --batch "$batch" \
        --steps "$steps" --model "${3:-tutorial}"
}
# The peer's wgpu-vulkan asks for a software adapter (lavapipe); elsewhere wgpu-auto takes the
# first GPU.
burn_backend=wgpu-auto
if ! command -v nvidia-smi >/dev/null; then burn_backend=wgpu-vulkan; fi
burn() {
    # Burn writes its autotune cache under XDG_CACHE_HOME and next to a Cargo.toml above it.
    (cd "$(mktemp -d)" && XDG_CACHE_HOME="$out/burn-cache" limited 240 \
        "$bin/burn_peer" "$burn_backend" --warmup 3 --steps "$steps" --fwd-steps 1 2>&1 | tail -4)
}

# The table and the verdict (the last lines of the check's output, also printed after each
# batch of the comparison), and what GPU_CHECK_KEEP keeps.
report() {
    section "medians (ms per train step; each round's runs alternate; :b2b = back to back, one wait at the end; :kernels = the profiled run's kernel time per step; :cold = a cold run's first step)"
    # By batch, the profiled runs' kernel times last.
    awk '{ print ($2 ~ /:(kernels|cold)$/), $0 }' "$table" | sort -s -k2,2n -k1,1n | cut -d' ' -f2- | awk '{
        key = $1 " " $2
        if (!(key in seen)) { order[++n] = key; seen[key] = 1 }
        ms[key] = ms[key] (ms[key] == "" ? "" : ", ") $3
    } END {
        printf "%-6s %-40s %s\n", "batch", "step", "per round (ms)"
        for (i = 1; i <= n; i++) { split(order[i], k, " "); printf "%-6s %-40s %s\n", k[1], k[2], ms[order[i]] }
    }'
    section "the issue's targets (scripts/gpu_verdict.py)"
    python3 "$here/gpu_verdict.py" "$table"
    reported=$(wc -l <"$table")
    if [ -n "$keep" ]; then
        mkdir -p "$keep"
        cp "$table" "$keep/medians.txt"
        for f in "$out"/profile-*/top_ops.txt; do
            [ -f "$f" ] && printf '=== %s\n' "${f#"$out"/}" && cat "$f"
        done >"$keep/top_ops.txt"
        {
            for f in "$out"/cache-*/*.txt; do
                [ -f "$f" ] && printf '=== %s\n' "${f#"$out"/}" && cat "$f"
            done
            echo "=== every candidate's time where the tuner measured (ours.log)"
            grep -h '^autotune: .*Measured' "$out/ours.log" 2>/dev/null | sort -u
        } >"$keep/choices.txt"
    fi
}

section "adapters"
command -v nvidia-smi >/dev/null && timeout -k 5 30 nvidia-smi -L
timeout -k 5 60 "$bin/device_info"

if [ -x "$coop" ]; then
    # Before anything is timed: a candidate that fails here is also failed by the self-check
    # each process runs before tuning, and never picked; the line names it.
    section "tensor-core products and convolutions (cooperative matrices) against the f64 oracle (tests/coop_matrix)"
    oracle '^test |test result|skipped|coop|cooperative|products|matmul' \
        180 "$coop" --test-threads 1 --nocapture
fi

if [ -x "$mixed" ]; then
    section "float16 kernels and loss scaling against the f64 oracle (tests/mixed_precision)"
    oracle '^test |test result' 120 "$mixed" --test-threads 1 f16 loss_scale
fi

if [ -x "$kernel_tests" ]; then
    # Every candidate the tuner may pick, forced in turn, and the fused gradients, in float32
    # (the float16 twins were checked just above).
    section "float32 kernels, every tuning candidate forced, against the f64 oracle (tests/kernels)"
    oracle '^test |test result' 150 "$kernel_tests" --test-threads 1 \
        every_tuning max_pool activation_and_bias register_blocked
fi

# The cold runs start from an empty tuning cache (each its own: the mixed-precision step tunes
# float32 ops too) and an empty driver shader cache (NVIDIA's keeps compiled pipelines on disk:
# without a fresh one only the first process would compile), as a first run on a new machine
# does. The warm runs share one cache per batch size, which the float32 cold run fills and the
# first mixed-precision warm run adds its float16 choices to (in its warm-up).
coldly() {
    __GL_SHADER_DISK_CACHE_PATH=$(mktemp -d) cold "$@"
}
first_batch=${batches%% *}
for batch in $batches; do
    section "train step, GPU:0, batch $batch, tuning from a cold cache (f32, then mixed_float16)"
    rm -rf "$out/cache-$batch" "$out/cache-$batch-mixed-cold"
    ANYGPU_CACHE_DIR="$out/cache-$batch" coldly "$batch anygpu-f32" clocks ours --batch-size "$batch"
    ANYGPU_CACHE_DIR="$out/cache-$batch-mixed-cold" coldly "$batch anygpu-mixed_float16" clocks ours \
        --batch-size "$batch" --mixed-precision
    if [ "$batch" = "$first_batch" ] && fits 240; then
        # What the background compile threads save: the same cold run compiling on one thread.
        rm -rf "$out/cache-serial"
        ANYGPU_CACHE_DIR="$out/cache-serial" ANYGPU_COMPILE_THREADS=0 \
            coldly "$batch anygpu-f32-compile-threads-0" clocks ours --batch-size "$batch"
    fi
    section "train step, GPU:0, batch $batch, tuned (warm cache), profiled, f32"
    ANYGPU_CACHE_DIR="$out/cache-$batch" busy "$batch anygpu-f32" clocks ours \
        --batch-size "$batch" --profile "$out/profile-$batch"
    section "train step, GPU:0, batch $batch, tuned (its float16 choices in its warm-up), profiled, mixed_float16"
    ANYGPU_CACHE_DIR="$out/cache-$batch" busy "$batch anygpu-mixed_float16" clocks ours \
        --batch-size "$batch" --mixed-precision --profile "$out/profile-$batch-mixed"
done

has_torch=0
if [ "${GPU_CHECK_TORCH:-1}" != 0 ] && timeout -k 5 60 python3 -c 'import torch' 2>/dev/null; then
    has_torch=1
fi
for round in $(seq "$rounds"); do
    for batch in $batches; do
        section "side by side, round $round, batch $batch: ours, PyTorch, alternating"
        export ANYGPU_CACHE_DIR="$out/cache-$batch"
        row "$batch anygpu-f32" ours --batch-size "$batch"
        if [ "$round" = 1 ] && [ "$batch" = "$first_batch" ] && fits 200; then
            # What submitting early after each step's wait saves: every submission 64 commands.
            ANYGPU_FIRST_SUBMIT=64 row "$batch anygpu-f32-first-submit-64" ours --batch-size "$batch"
        fi
        if [ "$has_torch" = 1 ]; then
            row "$batch torch-fp32-eager(TF32-off)" torch fp32
            row "$batch torch-default-eager" torch default
        fi
        row "$batch anygpu-mixed_float16" ours --batch-size "$batch" --mixed-precision
        if [ "$has_torch" = 1 ]; then
            row "$batch torch-amp-fp16" torch amp
            row "$batch torch-cuda-graph" torch graph
            if [ "$round" = 1 ] && [ "${GPU_CHECK_COMPILE:-1}" != 0 ] && fits 200; then
                row "$batch torch-compile" torch compile 150
            fi
        fi
        unset ANYGPU_CACHE_DIR
        report
    done
done

if [ "${GPU_CHECK_MODERN:-1}" != 0 ] && fits 120; then
    # Where 3×3 convolutions dominate (32-128 channels, two of them strided): whether the
    # tensor-core convolutions (implicit products) make mixed precision pay, and how ours
    # compare with cuDNN's (PyTorch's fp32 and AMP rows, when time is left).
    mb=${GPU_CHECK_MODERN_BATCH:-1024}
    section "the modern CNN (--model modern: 3x3 convolutions to 128 channels, BatchNormalization), batch $mb, tuned in its warm-up"
    export ANYGPU_CACHE_DIR="$out/cache-modern"
    rm -rf "$ANYGPU_CACHE_DIR"
    row "$mb modern-f32" ours --model modern --batch-size "$mb"
    row "$mb modern-mixed_float16" ours --model modern --batch-size "$mb" --mixed-precision
    if [ "$has_torch" = 1 ] && fits 90; then
        batch=$mb
        row "$mb modern-torch-fp32-eager(TF32-off)" torch fp32 60 modern
        row "$mb modern-torch-amp-fp16" torch amp 60 modern
    fi
    if fits 60; then
        busy "$mb modern-mixed_float16" clocks ours --model modern --batch-size "$mb" \
            --mixed-precision --profile "$out/profile-modern-mixed"
    fi
    unset ANYGPU_CACHE_DIR
fi

if [ -x "$bin/burn_peer" ] && [ "${GPU_CHECK_BURN:-1}" != 0 ] && fits 300; then
    section "Burn 0.22 (wgpu, Vulkan), batch 128: cold autotune cache, then warm; ours between"
    rm -rf "$out/burn-cache"
    burn
    ANYGPU_CACHE_DIR="$out/cache-128" ours | grep '^median'
    burn
    ANYGPU_CACHE_DIR="$out/cache-128" ours | grep '^median'
fi

if [ "${GPU_CHECK_BENCH:-0}" != 0 ] && fits 200; then
    section "kernels, GPU:0 (criterion, quick; tuned, batch 128 cache)"
    ANYGPU_CACHE_DIR="$out/cache-128" ANYGPU_BENCH_DEVICES=gpu0 limited 150 "$kernels" --bench --quick --noplot 2>&1 |
        grep -E '^[a-z0-9_]+/|time:'
fi

# The last lines of the output: the table again only if a run came after the last one printed.
[ "$(wc -l <"$table")" = "$reported" ] || report
section "done"
