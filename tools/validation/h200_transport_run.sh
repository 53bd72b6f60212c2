#!/usr/bin/env bash
# Every GPU step of the Ulysses transport hardening (issue 14) in one call on the one-GPU H200, in priority order,
# each with its own log and time limit; a failing step is reported and the next one still runs.
#
#   OUT=/tmp/h200 bash tools/validation/h200_transport_run.sh            # needs .baseline/ for the "before" rows
#
# .baseline/ holds the tree before the change (git archive c89d66c telefuser tools/bench/submission_cost.py): its
# submission_cost rows are the "before"; it runs against the tf-kernel built here, whose per-copy copy_2d is the
# same cudaMemcpy2DAsync loop as before. Logs go to $OUT/h200/ and, after every step, into $OUT/h200_logs.tgz.
set -u
OUT=${OUT:?set OUT to a folder for logs}
PY=${PYTHON:-python3}
LOG="$OUT/h200"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
TORCHRUN="$PY -m torch.distributed.run --standalone"

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$LOG/summary.txt"
  tail -n 8 "$LOG/$name.log"
  tar czf "$OUT/h200_logs.tgz" -C "$OUT" h200 2>/dev/null
}

{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc;
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } >"$LOG/env.txt" 2>&1
cat "$LOG/env.txt"
step build 150 make build-sm90 PYTHON="$PY"
export PYTHONPATH=$PWD
step submission_before_w2 60 env PYTHONPATH="$PWD/.baseline" TRANSPORT=ce-ipc $TORCHRUN --nproc-per-node=2 \
  .baseline/tools/bench/submission_cost.py
step submission_before_public_w2 60 env PYTHONPATH="$PWD/.baseline" $TORCHRUN --nproc-per-node=2 \
  tools/bench/submission_cost.py --transport ce-ipc --public-only --label "(before: c89d66c)"
step submission_after_w2 60 $TORCHRUN --nproc-per-node=2 tools/bench/submission_cost.py --transport ce-ipc \
  --label "(after)"
step tf_kernel_gpu 150 make -C tf-kernel test-gpu PYTHON="$PY" PYTEST_ARGS="-q -rs -s"
step telefuser_gpu 240 $PY -m pytest -q -rs --tb=short -p no:cacheprovider tests/gpu/test_copy_engine_cuda.py
step fault_matrix_gpu 200 $PY tools/validation/ulysses_fault_matrix.py --device cuda --output "$LOG/fault_matrix_gpu.md"
step error_paths 40 $PY tools/validation/tf_kernel_error_paths.py
step correctness_w4 90 $TORCHRUN --nproc-per-node=4 tools/validation/ulysses_correctness.py \
  --transports portable,ce-ipc --iterations 16
cat "$LOG/summary.txt"
