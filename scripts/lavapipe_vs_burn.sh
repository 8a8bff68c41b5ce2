#!/usr/bin/env bash
# The train step on lavapipe side by side with Burn 0.22's (../shared/peers/burn), in
# alternating pairs: each pair runs ours, then Burn's, and prints both medians and their ratio.
#
#   scripts/lavapipe_vs_burn.sh [PAIRS] [STEPS]
#
# PAIRS (default 3) alternations; STEPS (default 40) timed steps of ours, so that our run lasts
# about as long as Burn's 8 steps (a short run is more exposed to a burst of load on a shared
# machine). Needs Mesa's lavapipe and Burn's program built once (its README: BURN_PEER, or
# ~/.cache/burn-peer/release/burn_peer); Burn's autotune cache goes to BURN_CACHE (default
# ~/.cache/burn-peer-xdg) so that only the first pair pays its minutes of tuning.
set -euo pipefail

pairs=${1:-3}
steps=${2:-40}
burn=${BURN_PEER:-$HOME/.cache/burn-peer/release/burn_peer}
burn_cache=${BURN_CACHE:-$HOME/.cache/burn-peer-xdg}
root=$(cd "$(dirname "$0")/.." && pwd)

if [[ ! -x $burn ]]; then
    echo "Burn's program is not at $burn (set BURN_PEER; ../shared/peers/burn/README.md builds it)" >&2
    exit 1
fi
export WGPU_BACKEND=vulkan XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
cargo build --release --example fashion_mnist --manifest-path "$root/Cargo.toml" >&2
ours_bin=$root/target/release/examples/fashion_mnist

for ((i = 1; i <= pairs; i++)); do
    ours=$(cd "$root" && "$ours_bin" --device gpu:0 --time-steps "$steps" 2>&1 |
        sed -n 's/^median train step: \([0-9.]*\) ms.*/\1/p')
    theirs=$(cd "$(mktemp -d)" && XDG_CACHE_HOME=$burn_cache \
        "$burn" wgpu-vulkan --warmup 3 --steps 8 --fwd-steps 1 2>&1 |
        sed -n 's/^train step: median \([0-9.]*\) ms.*/\1/p')
    if [[ -z $ours || -z $theirs ]]; then
        echo "pair $i: a run failed (ours: '${ours}', Burn: '${theirs}')" >&2
        exit 1
    fi
    awk -v i="$i" -v o="$ours" -v b="$theirs" \
        'BEGIN { printf "pair %d: anygpu %.1f ms, Burn %.1f ms, ratio %.3f\n", i, o, b, o / b }'
done
