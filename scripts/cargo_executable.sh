# Sourced by scripts/gpu_pack.sh and scripts/gpu_check.sh.
# `executable CARGO_COMMAND...`: the executable cargo built for a --no-run target, from cargo's
# own report (a bench and an integration test are both called `kernels`, so the file name alone
# would not tell them apart).
executable() {
    "$@" --no-run --message-format=json |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -1
}
