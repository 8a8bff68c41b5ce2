#!/usr/bin/env bash
# A CNN's training step on CPU:0 side by side with TensorFlow's on the same machine,
# in alternating pairs: each pair runs ours, then TensorFlow's (scripts/tf_train_step.py), and
# prints both medians and their ratio, then the range of the ratios.
#
#   scripts/cpu_vs_tf.sh [PAIRS] [STEPS] [MODEL]
#
# PAIRS (default 4) alternations of STEPS (default 40) timed steps each, batch 128; MODEL
# `tutorial` (default) or `modern` (`fashion_mnist --model modern`). Needs
# `pip install tensorflow-cpu==2.21.*`. ANYGPU_CPU_SIMD=avx2 times our AVX2 kernels on an
# AVX-512 machine (docs/environment.md). Run it on a quiet machine: a build beside it moves
# both sides by tens of percent.
set -euo pipefail

pairs=${1:-4}
steps=${2:-40}
model=${3:-tutorial}
case $model in
tutorial | modern) ;;
*)
    echo "MODEL is tutorial or modern, not '$model'" >&2
    exit 2
    ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --example fashion_mnist --manifest-path "$root/Cargo.toml" >&2
ours_bin=$root/target/release/examples/fashion_mnist
grep -m1 'model name' /proc/cpuinfo >&2 || true
echo "CPU flags: $(grep -o -m1 -w 'avx512f' /proc/cpuinfo || echo 'no avx512f'); SIMD: ${ANYGPU_CPU_SIMD:-native}" >&2

ratios=()
for ((i = 1; i <= pairs; i++)); do
    ours=$(cd "$root" && "$ours_bin" --model "$model" --device cpu --time-steps "$steps" 2>&1 |
        sed -n 's/^median train step: \([0-9.]*\) ms.*/\1/p')
    tf=$(python3 "$root/scripts/tf_train_step.py" "$steps" "$model" 2>&1 |
        sed -n 's/.*median train step: \([0-9.]*\) ms.*/\1/p')
    if [[ -z $ours || -z $tf ]]; then
        echo "pair $i: a run printed no median (ours '$ours', TensorFlow '$tf')" >&2
        exit 1
    fi
    ratio=$(python3 -c "print(f'{$ours / $tf:.2f}')")
    ratios+=("$ratio")
    echo "pair $i: anygpu CPU:0 $ours ms, TensorFlow $tf ms, ratio $ratio"
done
echo "ratios (ours / TensorFlow's): ${ratios[*]}"
