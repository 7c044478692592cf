#!/usr/bin/env bash
# Every full-size plan (--dry-run) and the report regenerated from the committed json, written to OUT: run it before
# and after a change that should not change them (a move of code), then `diff -r BEFORE AFTER` and `git status docs records`.
#   bash scripts/plans_snapshot.sh /tmp/before; (move code); bash scripts/plans_snapshot.sh /tmp/after
set -euo pipefail
out=${1:?usage: bash scripts/plans_snapshot.sh OUT [DATA]}
data=${2:-../shared/data}
cd "$(dirname "$0")/.."
mkdir -p "$out"
for t in mt-en-de mt-en-fr lm-ptb lm-wt2 lm-1b lm-gpt2; do
  python -m recipes.reproduce "$t" --scale full --dry-run --data "$data" > "$out/$t.txt" 2>/dev/null
done
python -m recipes.reproduce.report --no-collect > "$out/report.txt" 2>&1
git status --short docs records
