#!/usr/bin/env bash
# Run the verification bundles under .device/ (made by `kminer bundle`) on a GPU box within a
# time budget, resuming where an earlier call stopped: a bundle NAME.tar.gz whose partial
# results were carried back as .device/NAME.partial.json runs only the tests they lack.
#   usage: benchmarks/run_bundles.sh SECONDS     results: $OUT/NAME_native.json
set -u
OUT=${OUT:-$PWD/bundles-out}
mkdir -p "$OUT"
end=$(( $(date +%s) + ${1:-570} ))
for b in .device/*.tar.gz; do
  [ -e "$b" ] || continue
  name=$(basename "$b" .tar.gz)
  left=$(( end - $(date +%s) ))
  [ "$left" -lt 30 ] && { echo "$name: not started (time)"; continue; }
  dir=$(mktemp -d) && chmod 755 "$dir" && tar xzf "$b" -C "$dir" && dir=$dir/$(ls "$dir")
  resume=()
  if [ -f ".device/$name.partial.json" ]; then
    cp ".device/$name.partial.json" "$dir/results.json" && resume=(--resume)
  fi
  start=$(date +%s)
  (cd "$dir" && timeout "$left" python3 run.py --out results.json "${resume[@]}" >run.log 2>&1)
  echo "$name: exit $? in $(( $(date +%s) - start )) s"
  [ -f "$dir/results.json" ] && cp "$dir/results.json" "$OUT/$(echo "$name" | tr -c "A-Za-z0-9_.\n-" _)_native.json"
  tail -n 2 "$dir/run.log"
done
