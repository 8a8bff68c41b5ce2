#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh runs and copies it into .gpucheck/ (ignored), so that a lent GPU
# machine without a Rust toolchain spends its time measuring, not compiling. Carry `.gpucheck`
# there and run `scripts/gpu_check.sh .gpucheck`.
set -eu
cargo build --release --example fashion_mnist --example device_info
cargo bench --no-run --bench kernels
mkdir -p .gpucheck
cp target/release/examples/fashion_mnist target/release/examples/device_info .gpucheck/
cp "$(ls -t target/release/deps/kernels-* | grep -v '\.d$' | head -1)" .gpucheck/kernels
# Burn's peer program, when it has been built (../shared/peers/burn/README.md).
burn="$HOME/.cache/burn-peer/release/burn_peer"
[ -x "$burn" ] && cp "$burn" .gpucheck/
strip .gpucheck/* 2>/dev/null || true
du -sh .gpucheck
