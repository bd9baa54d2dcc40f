#!/usr/bin/env bash
# The execution boundary on a GPU box (run through the device tool, as root, from the repo root):
# what the machine gives, the `gpu` tests of the boundary and the runner, and the verification
# bundles under .device/ (made by `kminer bundle`) run by their own run.py. Everything is run
# twice where a carried bubblewrap .deb is in .device/: once with what the box has, once with it.
#   usage: benchmarks/gpu_boundary.sh [tests] [bundles] [bwrap]     results under $OUT
set -u
OUT=${OUT:-$PWD/gpu-boundary-out}
mkdir -p "$OUT"
what=" $* "  # (bundles run with what they carry, not this checkout's miner/)
describe() { PYTHONPATH=$PWD python3 -c "import json; from miner import sandbox; print(json.dumps(sandbox.describe()))"; }
{ id; python3 -V; command -v python3 bwrap; nproc; nvidia-smi -L; uname -r; describe; } >"$OUT/env.txt" 2>&1
gpu_tests() {  # $1: the name of this pass, then the test files (default: boundary and runner)
  local name=$1 files=("${@:2}")
  [ ${#files[@]} = 0 ] && files=(tests/test_hostile_exec.py tests/test_runner.py)
  PYTHONPATH=$PWD python3 -m pytest -q -p no:cacheprovider -m gpu -rA "${files[@]}" \
    >"$OUT/gpu_tests_$name.txt" 2>&1
  echo "gpu tests ($name): exit $?" >>"$OUT/env.txt"
}
bundles() {  # $1: the name of this pass
  for b in .device/*.tar.gz; do
    [ -e "$b" ] || continue
    name=$(basename "$b" .tar.gz)
    dir=$(mktemp -d) && chmod 755 "$dir" && tar xzf "$b" -C "$dir"
    start=$(date +%s)
    dir=$dir/$(ls "$dir")  # the bundle's one folder
    (cd "$dir" && python3 run.py --out results.json >run.log 2>&1)
    echo "bundle $name ($1): exit $? in $(( $(date +%s) - start )) s" >>"$OUT/env.txt"
    cp "$dir/results.json" "$OUT/${name}_$1.json"
    tail -n 3 "$dir/run.log" >>"$OUT/env.txt"
  done
}
case $what in *" tests "*) gpu_tests native ;; esac
case $what in *" bundles "*) bundles native ;; esac
case $what in *" bwrap "*)
  deb=$(ls .device/bubblewrap_*.deb 2>/dev/null | head -n 1)
  if [ -n "$deb" ]; then
    dpkg -x "$deb" /tmp/bwrap-carried && export PATH=/tmp/bwrap-carried/usr/bin:$PATH
    { echo "with carried bubblewrap:"; bwrap --version; describe; } >>"$OUT/env.txt" 2>&1
    gpu_tests bwrap tests/test_hostile_exec.py
    case $what in *" bundles "*) bundles bwrap ;; esac
  fi ;;
esac
cat "$OUT/env.txt"
