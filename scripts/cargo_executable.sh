# Sourced by scripts/gpu_pack.sh and scripts/gpu_check.sh.
# `executable cargo test|bench ... --test|--bench NAME ...`: the executable cargo built for that
# target, from cargo's own report. A bench and an integration test are both called `kernels`,
# so the file name alone would not tell them apart; and cargo reports the package's binaries
# too (integration tests may run them), so the target's kind and name pick the one.
executable() {
    "$@" --no-run --message-format=json |
        python3 -c 'import json, sys
args = sys.argv[1:]
want = [(a[2:], args[i + 1]) for i, a in enumerate(args) if a in ("--test", "--bench")]
if len(want) != 1:
    sys.exit("executable: name one --test or --bench target")
kind, name = want[0]
found = []
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and t.get("name") == name and kind in t.get("kind", [])):
        found.append(m["executable"])
if not found:
    sys.exit(f"executable: cargo built no {kind} target called {name}")
print(found[-1])' "$@"
}
