#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh runs and packs it into .gpucheck/bins.tar.xz (ignored), so
# that a lent GPU machine without a Rust toolchain spends its time measuring, not compiling.
# Carry `.gpucheck/bins.tar.xz` there, unpack it (`tar xJf ... -C DIR`) and run
# `scripts/gpu_check.sh DIR`. Burn's peer program goes in too when it has been built
# (../shared/peers/burn/README.md).
set -eu
. "$(dirname "$0")/cargo_executable.sh"
cargo build --release --example fashion_mnist --example device_info
bench=$(executable cargo bench --bench kernels)
kernel_tests=$(executable cargo test --release --test kernels)
mixed=$(executable cargo test --release --test mixed_precision)
coop=$(executable cargo test --release --test coop_matrix)
rm -rf .gpucheck && mkdir -p .gpucheck/bin
cp target/release/examples/fashion_mnist target/release/examples/device_info .gpucheck/bin/
cp "$bench" .gpucheck/bin/kernels
cp "$kernel_tests" .gpucheck/bin/kernel_tests
cp "$mixed" .gpucheck/bin/mixed_precision
cp "$coop" .gpucheck/bin/coop_matrix
burn="$HOME/.cache/burn-peer/release/burn_peer"
if [ -x "$burn" ]; then cp "$burn" .gpucheck/bin/; fi
strip .gpucheck/bin/* 2>/dev/null || true
# The Vulkan and EGL loaders, as Debian packages: a GPU machine whose image has the NVIDIA
# driver but no loader lists no GPU adapter to wgpu. scripts/gpu_check.sh unpacks them there
# only when no libvulkan is installed.
mkdir -p .gpucheck/debs /tmp/gpucheck-apt/partial
apt_opts=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/gpucheck-apt)
if apt-get "${apt_opts[@]}" update -qq &&
    (cd .gpucheck/debs && apt-get "${apt_opts[@]}" download -qq libvulkan1 libegl1 libglvnd0 \
        libopengl0 libgl1 libglx0 libgles2); then
    cp .gpucheck/debs/*.deb .gpucheck/bin/
else
    echo "gpu_pack: could not download the Vulkan/EGL loaders; packing without them" >&2
fi
rm -rf .gpucheck/debs
# Written aside, tested, then moved into place: a half-written archive carried to the GPU
# machine would cost the whole call (its `tar xJf ... &&` never starts the check).
tar cJf .gpucheck/bins.tar.xz.part -C .gpucheck/bin .
xz -t .gpucheck/bins.tar.xz.part
mv .gpucheck/bins.tar.xz.part .gpucheck/bins.tar.xz
rm -rf .gpucheck/bin
du -sh .gpucheck/bins.tar.xz
