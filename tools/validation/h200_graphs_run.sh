#!/usr/bin/env bash
# The one-GPU run behind docs/perf/2026-12-02-h200-capture (issue 24): steady state without the host.
#   OUT=/tmp/h200 bash tools/validation/h200_graphs_run.sh [step ...]      (default: every step, in order)
# Steps: setup, tests, forward_fp8, capture, forward_bf16, ulysses_forward, session, minimax, official (and the
# reruns regions_fp8_check, graph_fp8 after fixes).
# Each step logs to $OUT/<step>.log and has its own time limit, so one slow step cannot eat the others' time.
set -u
OUT=${OUT:?set OUT to a folder for the logs}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(setup tests forward_fp8 capture forward_bf16 ulysses_forward session minimax official)

run() {  # run <step> <seconds> <command...>
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0))s"; tail -n 14 "$OUT/$name.log"
}

bench=tools/bench/host_overhead_bench.py
for step in "${steps[@]}"; do
  case $step in
    setup)  # carried wheels (.whl: nvidia-cudnn-frontend for FP8 attention), then tf-kernel
      if ls .whl/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
      fi
      $PY -c "import tf_kernel" 2>/dev/null || run build 240 make build-sm90 PYTHON=$PY ;;  # kept on a warm machine
    tests)
      run tests_regions 240 $PY -m pytest -s -q -p no:cacheprovider tests/gpu/test_compiled_regions_cuda.py \
        tests/gpu/test_lingbot_fp8_window_cuda.py tests/unit/test_fusion.py
      run tests_graphs 200 $PY -m pytest -s -q -p no:cacheprovider tests/gpu/test_lingbot_graphs_cuda.py ;;
    forward_fp8) run forward_fp8 420 $PY $bench forward --variants fp8 --output "$OUT/forward_fp8.json" ;;
    regions_fp8_check) run regions_fp8_check 150 $PY -m pytest -s -q -p no:cacheprovider \
      tests/gpu/test_compiled_regions_cuda.py -k match_the_reference ;;
    graph_fp8) run graph_fp8 300 $PY $bench forward --variants fp8 --paths regions,graph --output "$OUT/graph_fp8.json" ;;
    forward_bf16) run forward_bf16 300 $PY $bench forward --variants bf16 --output "$OUT/forward_bf16.json" ;;
    capture)
      for w in 2 4; do
        run capture_u$w 90 $PY -m torch.distributed.run --standalone --nproc-per-node=$w \
          tools/bench/ulysses_capture_bench.py --output "$OUT/capture_u$w.json"
      done ;;
    ulysses_forward)
      for w in 2 4; do
        run ulysses_forward_u$w 200 $PY -m torch.distributed.run --standalone --nproc-per-node=$w $bench forward \
          --ulysses $w --layers 8 --variants fp8 --resolutions 832x480 --output "$OUT/ulysses_forward_u$w.json"
      done ;;
    session) run session 420 $PY $bench session --layers 8 --output "$OUT/session.json" ;;
    minimax) run minimax 300 $PY $bench minimax --layers 8 --variants bf16 --output "$OUT/minimax.json" ;;
    official)
      for g in on off; do
        run official_fp8_graphs_$g 300 env TORCH_LOGS=recompiles $PY examples/lingbot_world_v2/run_i2v.py \
          --config official --vae-dtype bfloat16 --vae-fast --quantization fp8 --attn-impl cudnn_fp8 --warmup \
          --cuda-graphs $g --no-progress --output "/tmp/official_$g.mp4"
      done ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
