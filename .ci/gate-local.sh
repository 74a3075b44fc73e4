#!/usr/bin/env bash
# docs/ci.md's GitHub Actions recipe, run locally on the committed clips (fixtures/audio/*.wav)
# and the seeded whisper-rand-a fixture, so the recipe cannot rot (`make test-ci`, in `make test`):
#   0. every `xray` command of the workflow in docs/ci.md uses only flags `xray SUB --help` lists;
#   1. the baseline (the workflow's `baseline` job on main): the corpus, cold reference cache;
#   2. the shard matrix (`--shard K/N`), each shard on the now warm cache (every reference a hit);
#   3. `xray summarize` of the shards, the merged summary equal to the baseline's clips;
#   4. `xray gate` of the merged corpus against the baseline, with JUnit: passes;
#   5. the same with a planted fault in one shard: the gate fails (exit 1) and JUnit says so.
# Usage: .ci/gate-local.sh PATH/TO/xray (the oracle build: the cold cache runs the reference).
set -euo pipefail
cd "$(dirname "$0")/.."
x=${1:?usage: .ci/gate-local.sh PATH/TO/xray}
MODEL=fixtures/build/whisper-rand-a
CLIPS=fixtures/audio
N=2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
passed=0; failed=0
ok() { echo "ci: ok   $1"; passed=$((passed + 1)); }
bad() { echo "ci: FAIL $1" >&2; failed=$((failed + 1)); }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

# 0. The workflow's commands: each `xray SUB --flag` must be a flag of that subcommand.
cmds=$(python3 - docs/ci.md <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
    block = re.sub(r"\\\n\s*", " ", block)  # backslash-continued lines joined
    for line in block.splitlines():
        for m in re.finditer(r"(?:^|[\s;&|(])xray ([a-z][a-z-]*)((?: +[^\s;&|]+)*)", line):
            print(m.group(1), *sorted(set(re.findall(r"--[a-z][a-z0-9-]*", m.group(2)))))
PY
)
nbad=$failed
while read -r sub flags; do
  [ -z "$sub" ] && continue
  help=$("$x" "$sub" --help 2>&1) || { bad "docs/ci.md: xray $sub is not a subcommand"; continue; }
  for flag in $flags; do
    grep -qE -- "(^|[ ,])$flag([ =,]|$)" <<<"$help" || bad "docs/ci.md: xray $sub has no $flag"
  done
done <<<"$cmds"
# The recipe's steps, each with the flags that make it the recipe.
for want in "check --evidence-dir --reference-cache --shard" "summarize --out" "gate --baseline --evidence --junit"; do
  read -r sub need <<<"$want"
  have=$(awk -v s="$sub" '$1 == s' <<<"$cmds")
  for flag in $need; do
    grep -qE -- "(^| )$flag( |$)" <<<"$have" || bad "docs/ci.md: the workflow has no xray $sub $flag"
  done
done
if [ "$failed" -eq "$nbad" ]; then ok "docs/ci.md: $(grep -c . <<<"$cmds") xray commands, every flag the CLI's"; fi

# 1. The baseline: the whole corpus, filling the reference cache (cold).
t=$(now)
if "$x" check --model "$MODEL" --audio "$CLIPS" --max-steps 3 --reference-cache "$out/cache" \
     --evidence-dir "$out/baseline" 2>"$out/log"; then
  ok "baseline: $(grep -c . <<<"$(ls "$out/baseline"/*.evidence.json)") clips, cold cache ($(took "$t"))"
else bad "baseline: $(tail -1 "$out/log")"; fi

# 2. The shard matrix on the warm cache: every reference read from it, no oracle run.
t=$(now)
for k in $(seq 1 $N); do
  if "$x" check --model "$MODEL" --audio "$CLIPS" --max-steps 3 --shard "$k/$N" \
       --reference-cache "$out/cache" --evidence-dir "$out/shard-$k" 2>"$out/log"; then
    misses=$(grep -l '"hit": false' "$out/shard-$k"/*.evidence.json || true)
    hits=$(grep -l '"hit": true' "$out/shard-$k"/*.evidence.json | wc -l)
    if [ -z "$misses" ] && [ "$hits" -ge 1 ]; then ok "shard $k/$N: $hits clips, every reference from the cache"
    else bad "shard $k/$N: references not from the cache: $misses"; fi
  else bad "shard $k/$N: $(tail -1 "$out/log")"; fi
done
echo "ci: $N shards on the warm cache took $(took "$t")"

# 3. Summarize the shards into one corpus directory.
shards=$(for k in $(seq 1 $N); do printf '%s ' "$out/shard-$k"; done)
# shellcheck disable=SC2086
if "$x" summarize $shards --out "$out/merged/summary.json" --markdown "$out/merged/summary.md" >/dev/null 2>"$out/log"; then
  base_clips=$(ls "$out/baseline"/*.evidence.json | xargs -n1 basename | sort)
  merged_clips=$(python3 -c 'import json,sys; print("\n".join(sorted(c["evidence"].split("/")[-1] for c in json.load(open(sys.argv[1]))["clips"])))' "$out/merged/summary.json")
  if [ "$base_clips" = "$merged_clips" ]; then ok "summarize: the shards hold the baseline's clips"
  else bad "summarize: clips differ: $merged_clips vs $base_clips"; fi
else bad "summarize: $(tail -1 "$out/log")"; fi

# 4. The gate against the baseline, with JUnit.
if "$x" gate --evidence "$out/merged" --baseline "$out/baseline" --junit "$out/junit.xml" >"$out/gate" 2>"$out/log" \
   && grep -q "<testsuite" "$out/junit.xml" && ! grep -q "<failure" "$out/junit.xml"; then
  ok "gate: $(tail -1 "$out/gate")"
else bad "gate: $(tail -1 "$out/gate" 2>/dev/null) $(tail -1 "$out/log")"; fi

# 5. A regression in one shard fails the gate: exit 1, and the JUnit file names the failure.
"$x" check --model "$MODEL" --audio "$CLIPS" --max-steps 3 --shard "$N/$N" --inject gelu_tanh --no-drill \
  --reference-cache "$out/cache" --evidence-dir "$out/broken-$N" 2>/dev/null && true
broken=$(for k in $(seq 1 $((N - 1))); do printf '%s ' "$out/shard-$k"; done)
# shellcheck disable=SC2086
"$x" summarize $broken "$out/broken-$N" --out "$out/merged-broken/summary.json" >/dev/null 2>&1 && true
rc=0; "$x" gate --evidence "$out/merged-broken" --baseline "$out/baseline" --junit "$out/junit-broken.xml" >"$out/gate" 2>&1 || rc=$?
if [ "$rc" -eq 1 ] && grep -q "<failure" "$out/junit-broken.xml"; then ok "gate on a planted fault: exit 1, $(tail -1 "$out/gate")"
else bad "gate on a planted fault exited $rc: $(tail -1 "$out/gate")"; fi

echo "ci: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
