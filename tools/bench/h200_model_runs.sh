#!/usr/bin/env bash
# The model measurements of one H200 session, step by step, each with its own log and time limit.
#
#   OUT=/tmp/h200 bash tools/bench/h200_model_runs.sh setup minimax lingbot      # or any subset of the steps below
#
# Steps: setup (carried wheels + tf-kernel), qkprep (compiled-kernel tests), gpu_checks (those + serve-stream
# Ctrl-C on CUDA + the copy-engine GPU suite), minimax (official DiT call, fused vs
# eager elementwise chains), minimax_ce (8 layers, Ulysses2 over 2 processes sharing the GPU), overlap (MiniMax H3 layer
# trace), lingbot (official session, DiT only), lingbot_ce (8 layers, Ulysses2, 2 processes), lingbot_ce_fusion (the same, compiled vs eager chains
# alternated in one run), lingbot_ce_transports (the same, ce-ipc vs portable), stream_shutdown
# (serve-stream Ctrl-C test alone), minimax_e2e (run_t2va at the official sizes, short clip), diffusers (ours vs
# WanTransformer3DModel), diffusers_profile (the same at 32,760 tokens with top GPU kernels), e2e (run_i2v at the
# official sizes, 77 frames, MP4 + metrics), session_ab (whole LingBot sessions: the camera-reuse and lean-commit path
# against the old one, a bf16 VAE, FP8 GEMMs, side by side with quality figures), minimax_vae (run_t2va at 768p 5 s
# with 2 steps: diffusers' MiniMax H3 VAEs at official size, decode times and peak memory), fp8 (one official DiT
# call of each model, bf16 against FP8 GEMMs side by side, with the output's relative L2 and cosine), vae (the Wan
# VAE's encode and decode per chunk: fp32, bf16, fused norm+SiLU, channels-last), attn_fp8 (cuDNN frontend FP8
# attention: its GPU tests and the bench against cuDNN bf16; needs .whl/fp8/), submission_profile (the copy-engine
# submission cost with a cProfile of the public calls; needs the tf-kernel build from setup), stream_replay
# (serve-stream at the official size driven over its WebSocket for the one-minute replay, lossless checks),
# setup_models (the wheels without the tf-kernel build), adaln (MiniMax H3 AdaLN tables GPU tests), session_fp8_attn
# (LingBot sessions with --vae-fast: bf16, FP8 GEMMs, FP8 GEMMs + FP8 attention), fp8_minimax_attn (MiniMax H3 official
# call: bf16, FP8 GEMMs, FP8 GEMMs + FP8 attention; needs .whl/fp8/), session_fp8_window (the same sessions with FP8
# attention over the FP8-key window and over a bf16 window quantized per call), fp8_tests (the FP8 attention and the
# FP8-key window GPU tests; needs .whl/fp8/), e2e_fastest (run_i2v at the official size with FP8 GEMMs, FP8 attention,
# the bf16 VAE and --vae-fast), vae_overlap (does the VAE work beside the DiT on another stream hide it? FP8 and bf16
# DiT; needs .whl/fp8/), stream_replay_fastest (the one-minute replay with those settings), diffusers_best (the
# vs-diffusers table at 32,760 tokens only, 2 iterations), diffusers_fp8 (the same with ours in FP8 as one more row),
# serve_warmup (telefuser serve at the official size: the first jobs after start, warm-up off and on; needs
# .whl/serve/), gpu_tests (tests/gpu as its conftest runs without a tf-kernel build).
# Logs and JSON go to $OUT; a failing step is reported and the next one still runs.
set -u
OUT=${OUT:?set OUT to a folder for logs}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-}

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$OUT/steps.log"
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - start)) s" | tee -a "$OUT/steps.log"
  tail -n 25 "$OUT/$name.log"
}

TORCHRUN2="$PY -m torch.distributed.run --standalone --nproc-per-node=2"

for s in "$@"; do
  case $s in
    setup)
      step pip 120 $PY -m pip install --no-deps --no-index .whl/*.whl
      # serve-stream's packages (the device image has none); resolved from the carried folder only
      step pip_serve 120 $PY -m pip install --no-index --find-links .whl/serve fastapi uvicorn websockets httpx
      step build 300 make build-sm90 PYTHON="$PY"
      { nvidia-smi; $PY -c "import torch, diffusers, av; print(torch.__version__, diffusers.__version__, av.__version__)"; git log -1 --format='%H %cd'; } >"$OUT/env.txt" 2>&1 ;;
    setup_models)  # the model benches' wheels only (no tf-kernel build: one process per GPU needs no copy engine)
      step pip 120 $PY -m pip install --no-deps --no-index .whl/*.whl
      step pip_fp8 60 $PY -m pip install --no-deps --no-index .whl/fp8/*.whl
      { nvidia-smi; $PY -c "import torch, diffusers, av, cudnn; print(torch.__version__, diffusers.__version__, av.__version__, cudnn.backend_version_string())"; } >"$OUT/env.txt" 2>&1 ;;
    adaln) step adaln 180 $PY -m pytest -q -rs --tb=short -p no:logging tests/gpu/test_minimax_adaln_tables_cuda.py ;;
    session_fp8_attn) step session_fp8_attn 590 $PY tools/bench/lingbot_session_ab.py --rounds 1 \
        --variants reuse+fast-vae,fp8+fast-vae,fp8+fp8-attn+fast-vae --output "$OUT/lingbot_session_fp8_attn.json" ;;
    session_fp8_window) step session_fp8_window 590 $PY tools/bench/lingbot_session_ab.py --rounds 1 \
        --variants reuse+fast-vae,fp8+fast-vae,fp8+fp8-attn-requant+fast-vae,fp8+fp8-attn+fast-vae \
        --output "$OUT/lingbot_session_fp8_window.json" ;;
    e2e_fastest) step e2e_fastest 300 $PY examples/lingbot_world_v2/run_i2v.py --config official --device cuda --no-progress \
        --quantization fp8 --attn-impl cudnn_fp8 --vae-dtype bfloat16 --vae-fast --output "$OUT/lingbot_e2e_fastest/session.mp4" ;;
    diffusers_best) step diffusers_best 420 $PY tools/bench/lingbot_world_bench.py vs-diffusers --frames 21 --iters 2 \
        --output "$OUT/lingbot_vs_diffusers_best.json" ;;
    vae_overlap)
      step vae_overlap_fp8 300 $PY tools/bench/vae_overlap_bench.py --iters 7 --quantization fp8 --attn-impl cudnn_fp8 \
        --output "$OUT/vae_overlap_fp8.json"
      step vae_overlap_bf16 300 $PY tools/bench/vae_overlap_bench.py --iters 7 --output "$OUT/vae_overlap_bf16.json" ;;
    dit_graph) step dit_graph_fp8 300 $PY tools/bench/vae_overlap_bench.py --iters 5 --quantization fp8 \
        --attn-impl cudnn_fp8 --host-profile 30 --output "$OUT/dit_graph_fp8.json" ;;
    fp8_tests) step fp8_tests 240 $PY -m pytest -q -rs -s --tb=short -p no:logging \
        tests/gpu/test_attention_fp8_cuda.py tests/gpu/test_lingbot_fp8_window_cuda.py ;;
    fp8_minimax_attn) step fp8_minimax_attn 590 $PY tools/bench/fp8_dit_bench.py --model minimax --sequential --iters 2 \
        --fp8-attention --output "$OUT/fp8_minimax_attn.json" ;;
    gpu_checks) step gpu_checks 420 $PY -m pytest -q -rs --tb=short -p no:logging tests/unit/test_qk_prep.py tests/unit/test_fusion.py tests/gpu/test_stream_shutdown_cuda.py tests/gpu/test_copy_engine_cuda.py ;;
    qkprep) step qkprep 300 $PY -m pytest -q -rs --tb=short -p no:logging tests/unit/test_qk_prep.py tests/unit/test_fusion.py ;;
    minimax) step minimax 420 $PY tools/bench/minimax_h3_dit_bench.py --fusion both --iters 3 --output "$OUT/minimax_official.json" ;;
    minimax_ce) step minimax_ce 300 $TORCHRUN2 tools/bench/minimax_h3_dit_bench.py --layers 8 --ulysses 2 --iters 3 --output "$OUT/minimax_ce_u2.json" ;;
    overlap) step overlap 240 $TORCHRUN2 tools/validation/profile_ulysses_overlap.py --preset minimax_h3_tp2_u2 --output "$OUT/overlap_minimax" ;;
    lingbot) step lingbot 420 $PY tools/bench/lingbot_world_bench.py session --fusion both --output "$OUT/lingbot_session.json" ;;
    lingbot_ce_fusion) step lingbot_ce_fusion 420 $TORCHRUN2 tools/bench/lingbot_world_bench.py session --layers 8 --ulysses 2 --chunks 3 --fusion both --output "$OUT/lingbot_ce_u2_fusion.json" ;;
    lingbot_ce_transports) step lingbot_ce_transports 420 $TORCHRUN2 tools/bench/lingbot_world_bench.py session --layers 8 --ulysses 2 --chunks 3 --transports ce-ipc,portable --output "$OUT/lingbot_ce_u2_transports.json" ;;
    stream_shutdown) step stream_shutdown 300 $PY -m pytest -q -rs --tb=short -p no:logging tests/gpu/test_stream_shutdown_cuda.py ;;
    minimax_e2e) step minimax_e2e 420 $PY examples/minimax_h3/run_t2va.py --config official --device cuda --duration 0.2 --resolution 256 --steps 3 --no-progress --output "$OUT/minimax_e2e/h3.mp4" ;;
    lingbot_ce) step lingbot_ce 300 $TORCHRUN2 tools/bench/lingbot_world_bench.py session --layers 8 --ulysses 2 --chunks 3 --output "$OUT/lingbot_ce_u2.json" ;;
    diffusers) step diffusers 600 $PY tools/bench/lingbot_world_bench.py vs-diffusers --output "$OUT/lingbot_vs_diffusers.json" ;;
    diffusers_profile) step diffusers_profile 420 $PY tools/bench/lingbot_world_bench.py vs-diffusers --frames 21 --iters 1 --profile --output "$OUT/lingbot_vs_diffusers_profile.json" ;;
    e2e) step e2e 480 $PY examples/lingbot_world_v2/run_i2v.py --config official --device cuda --no-progress --output "$OUT/lingbot_e2e/session.mp4" ;;
    session_ab) step session_ab 600 $PY tools/bench/lingbot_session_ab.py --rounds 2 --output "$OUT/lingbot_session_ab.json" ;;
    fp8) step fp8_minimax 600 $PY tools/bench/fp8_dit_bench.py --model minimax --sequential --output "$OUT/fp8_minimax.json"
         step fp8_lingbot 420 $PY tools/bench/fp8_dit_bench.py --model lingbot --output "$OUT/fp8_lingbot.json" ;;
    minimax_vae) step minimax_vae 600 $PY examples/minimax_h3/run_t2va.py --config official --device cuda --duration 5 --resolution 768 --steps 2 --no-progress --output "$OUT/minimax_vae/h3.mp4" ;;
    stream_replay) step stream_replay 590 $PY tools/bench/stream_replay.py --config official --device cuda \
        --vae-dtype bfloat16 --startup-timeout 420 --output "$OUT/stream_replay_1min.json" \
        --service-log "$OUT/stream_replay_service.log" -- --vae-fast ;;
    stream_replay_fastest)
      step pip_serve 120 $PY -m pip install --no-index --find-links .whl/serve fastapi uvicorn websockets httpx
      step stream_replay_fastest 560 $PY tools/bench/stream_replay.py --config official --device cuda \
        --vae-dtype bfloat16 --startup-timeout 300 --output "$OUT/stream_replay_fastest_1min.json" \
        --service-log "$OUT/stream_replay_fastest_service.log" -- --vae-fast --quantization fp8 --attn-impl cudnn_fp8 ;;
    vae) step vae 300 $PY tools/bench/wan_vae_bench.py --output "$OUT/wan_vae.json" ;;
    attn_fp8)
      step pip_fp8 60 $PY -m pip install --no-deps --no-index .whl/fp8/*.whl
      step attn_fp8_tests 180 $PY -m pytest -q -rs --tb=short -p no:logging tests/gpu/test_attention_fp8_cuda.py
      step attn_fp8_bench 240 $PY tools/bench/attention_fp8_bench.py --output "$OUT/attention_fp8.json" ;;
    submission_profile) step submission_profile 90 $TORCHRUN2 tools/bench/submission_cost.py --transport ce-ipc --profile 30 --label "(profiled)" ;;
    serve_warmup)  # telefuser serve (MiniMax H3, official size): the first job without and with the warm-up
      step pip_serve 120 $PY -m pip install --no-index --find-links .whl/serve fastapi uvicorn websockets httpx openai
      step serve_warmup_off 300 $PY tools/bench/video_service_bench.py --config official --device cuda --warmup off \
        --jobs 1344x768:1 1344x768:1 --output "$OUT/video_service_warmup_off.json" \
        --service-log "$OUT/video_service_warmup_off_service.log" -- --seconds-default 1
      step serve_warmup_on 360 $PY tools/bench/video_service_bench.py --config official --device cuda --warmup on \
        --jobs 1344x768:1 1344x768:1 1344x768:1 1344x768:2 --output "$OUT/video_service_warmup_on.json" \
        --prompt "a lighthouse at dusk, waves breaking on the rocks" "a red fox" \
        "a slow pan over a crowded night market in the rain, neon signs reflected in the puddles" \
        --service-log "$OUT/video_service_warmup_on_service.log" -- --seconds-default 1 ;;
    serve_recompiles)  # the same, with torch.compile's recompilations and their reasons in the service log
      step pip_serve 120 $PY -m pip install --no-index --find-links .whl/serve fastapi uvicorn websockets httpx openai
      TORCH_LOGS=recompiles step serve_recompiles 360 $PY tools/bench/video_service_bench.py --config official \
        --device cuda --warmup on --jobs 1344x768:1 1344x768:1 1344x768:1 1344x768:2 \
        --prompt "a lighthouse at dusk, waves breaking on the rocks" "a red fox" \
        "a slow pan over a crowded night market in the rain, neon signs reflected in the puddles" \
        --output "$OUT/video_service_recompiles.json" --service-log "$OUT/video_service_recompiles_service.log" \
        -- --seconds-default 1 ;;
    diffusers_fp8) step diffusers_fp8 420 $PY tools/bench/lingbot_world_bench.py vs-diffusers --frames 21 --iters 2 \
        --with-fp8 --output "$OUT/lingbot_vs_diffusers_fp8.json" ;;
    gpu_tests) step gpu_tests 300 $PY -m pytest -q -rs --tb=short -p no:logging tests/gpu ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
done
