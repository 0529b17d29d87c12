#!/usr/bin/env bash
# Run nbdist's GPU checks on a machine with CUDA: the tests in tests/gpu (per-replica streams,
# NcclAllReduce, one engine per GPU pinned, the NCCL process group and its checked collectives,
# two workers sharing one GPU over gloo, the sharded strategy on one GPU, NCCL refused on a
# shared GPU, CUDA prefetch), then the
# collective and training benchmarks. Results: the pytest summary and the benchmarks' tables;
# their JSON (benchmarks/results/) is copied to ${OUT:-gpu-check}/.
#
#   scripts/gpu-check.sh            # from the repository root, in the dev environment
#   BENCH_ARGS=--quick scripts/gpu-check.sh   # one launch per benchmark (a short lease)
#   BENCHES="bench_user_collective" scripts/gpu-check.sh   # some of the benchmarks
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-gpu-check}
BENCH_ARGS=${BENCH_ARGS:-}
BENCHES=${BENCHES:-bench_all_reduce bench_batch_reduce bench_user_collective \
bench_multi_worker_allreduce bench_multi_worker_training bench_sharded}
mkdir -p "$OUT"

"$PYTHON" - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit("gpu-check: no CUDA device visible; run this on a GPU machine.")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
PY

status=0
"$PYTHON" -m pytest -p no:cacheprovider -q -rs tests/gpu tests/unit/test_compiled_steps.py \
    2>&1 | tee "$OUT/tests.txt" || status=$?

for bench in $BENCHES; do
    echo "== benchmarks/$bench.py"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
    "$PYTHON" "benchmarks/$bench.py" $BENCH_ARGS 2>&1 | tee "$OUT/$bench.txt" || status=$?
done
cp -f benchmarks/results/*.json "$OUT/" 2>/dev/null || true
exit "$status"
