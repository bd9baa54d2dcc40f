#!/bin/bash
# Run every row of an export the way the dataset card tells users to: its test_code, standalone,
# against a prediction (here the row's own label), on a machine with a GPU, nvcc and torch.
# Usage: benchmarks/run_exported_rows.sh OUT/train.jsonl WORKDIR [PARALLEL]
# Prints the exit codes' counts and the outcomes in each row's KMINER_REPORT.
set -euo pipefail
rows=$1 work=$2 parallel=${3:-16}
mkdir -p "$work"
python3 - "$rows" "$work" <<'PY'
import json, sys
from pathlib import Path
for line in open(sys.argv[1]):
    r = json.loads(line)
    d = Path(sys.argv[2]) / r["id"]
    d.mkdir(parents=True, exist_ok=True)
    (d / "test_row.py").write_text(r["test_code"])
    (d / "prediction.cu").write_text(r["label"])
PY
one() {
  cd "$1"
  KMINER_IMPL=$PWD/prediction.cu KMINER_REPORT=$PWD/report.json KMINER_BUILD_DIR=$PWD/build \
    timeout 500 python3 -m pytest -q -x test_row.py > log.txt 2>&1 && echo 0 > rc || echo $? > rc
}
export -f one
ls -d "$work"/*/ | xargs -P "$parallel" -I{} bash -c 'one {}'
cat "$work"/*/rc | sort | uniq -c
python3 -c "
import json, glob, collections
print(collections.Counter(json.load(open(f)).get('outcome') for f in glob.glob('$work/*/report.json')))"
