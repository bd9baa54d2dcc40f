#!/usr/bin/env bash
# Run the verification bundles under .device/ (made by `kminer bundle`) on a GPU box within a
# time budget, resuming where an earlier call stopped: a bundle NAME.tar.gz whose partial
# results were carried back as .device/NAME.partial.json runs only the tests they lack.
# Bundles run side by side (JOBS at a time, default 3): the box has 16 cores and a test's time
# is mostly one nvcc process, so device time goes further than running them one after another;
# the cores are shared out between them (--jobs), so three bundles never run 3 x 16 nvcc at once.
#   usage: [JOBS=n] benchmarks/run_bundles.sh SECONDS     results: $OUT/NAME_native.json
# (at most 7 bundles a call: a device call brings back 8 files, the 8th being its own output)
set -u
OUT=${OUT:-$PWD/bundles-out}
mkdir -p "$OUT"
end=$(( $(date +%s) + ${1:-570} ))
jobs_max=${JOBS:-3}
builds=$(( $(nproc) / jobs_max )); [ "$builds" -lt 1 ] && builds=1  # nvcc slots of each bundle

run_one() {  # bundle path
  local b=$1 name dir left start out log resume=()
  name=$(basename "$b" .tar.gz)
  left=$(( end - $(date +%s) ))
  [ "$left" -lt 30 ] && { echo "$name: not started (time)"; return; }
  # unpacked under the repository (ignored by git): a warm box's next call finds the bundle's
  # builds there and does not redo them; a bundle whose bytes changed is unpacked afresh
  dir=$PWD/.bundles-work/$name
  sum=$(sha256sum "$b" | cut -c1-16)
  if [ "$(cat "$dir.sum" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$dir" && mkdir -p "$dir" && chmod 755 "$dir" && tar xzf "$b" -C "$dir" || return
    echo "$sum" >"$dir.sum"
  fi
  dir=$dir/$(ls "$dir")
  out="$OUT/$(echo "$name" | tr -c "A-Za-z0-9_.\n-" _)_native.json"  # written as it goes:
  if [ -f ".device/$name.partial.json" ]; then  # a call cut short still brings back its part
    cp ".device/$name.partial.json" "$out" && resume=(--resume)
  fi
  start=$(date +%s)
  # the log stays on the box (only 8 files come back from a call: one results file a bundle);
  # its last lines are printed below, so a bundle cut short still tells why
  log="$PWD/.bundles-work/$name.log"
  (cd "$dir" && timeout -k 5 "$left" python3 run.py --jobs "$builds" --out "$out" "${resume[@]}" >"$log" 2>&1)
  echo "$name: exit $? in $(( $(date +%s) - start )) s"
  tail -n 2 "$log"
}

for b in .device/*.tar.gz; do
  [ -e "$b" ] || continue
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  run_one "$b" &
done
wait
