"""The plans: which steps one device call (or a few) runs, in order, with their time limits. Data only.

A command is written as a shell line; {py}, {out} and {site} are filled in when it runs (steps.py). Steps of the old
shell runners that were left out (one-day experiments, or subsets of a step kept here) are listed in docs/perf/README.md
under "Step runner".
"""

from __future__ import annotations

from tools.run.steps import Plan, Step, command, module, pytest, torchrun

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}  # as the device notes ask
FASTEST = "--vae-dtype bfloat16 --vae-fast --quantization fp8 --attn-impl cudnn_fp8"  # LingBot's fastest settings
RUN_I2V = "{py} examples/lingbot_world_v2/run_i2v.py --config official --no-progress"
RUN_T2VA = "{py} examples/minimax_h3/run_t2va.py --config official --device cuda --no-progress"
HOST_BENCH = "tools.bench.host_overhead_bench"
PROMPTS = (
    "'a lighthouse at dusk, waves breaking on the rocks' 'a red fox' "
    "'a slow pan over a crowded night market in the rain, neon signs reflected in the puddles'"
)

# ---- setup ----------------------------------------------------------------------------------------------------------
SETUP = (
    Step(
        "setup_wheels",
        240,
        command(
            "{py} -m pip install -q --no-index --no-deps --no-compile --target {site} .whl/*.whl .whl/fp8/*.whl "
            ".whl/serve/*.whl"
        ),
        what="the carried wheels (.whl/: diffusers, av; fp8/: cuDNN frontend; serve/: the services' packages)",
        setup=True,
    ),
    Step(
        "tf_kernel",
        300,
        command("make build-sm90 PYTHON={py}"),
        what="build tf-kernel for this interpreter (skipped when it imports already)",
        skip_if=command("{py} -c 'import tf_kernel'"),
        setup=True,
    ),
)
TF_KERNEL = SETUP[1]

# ---- one H200: the models ---------------------------------------------------------------------------------------
H200_MODELS = Plan(
    "h200-models",
    "the model measurements on one H200: official calls, FP8, VAE, diffusers, services, end to end",
    (
        *SETUP,
        Step("gpu_tests", 560, pytest("tests/gpu"), "tests/gpu as its conftest runs"),
        Step(
            "unit_cuda",
            300,
            pytest("tests/unit/test_qk_prep.py tests/unit/test_fusion.py"),
            "the unit tests with CUDA cases: compiled Q/K prep and fused elementwise chains",
        ),
        Step(
            "minimax",
            420,
            module("tools.bench.minimax_h3_dit_bench --fusion both --iters 3 --output {out}/minimax_official.json"),
            "MiniMax H3 official DiT call, fused against eager elementwise chains",
        ),
        Step(
            "minimax_ce",
            300,
            torchrun(
                2, "tools.bench.minimax_h3_dit_bench --layers 8 --ulysses 2 --iters 3 --output {out}/minimax_ce_u2.json"
            ),
            "MiniMax H3, 8 layers, Ulysses2 over 2 processes sharing the GPU (copy engine over CUDA IPC)",
        ),
        Step(
            "overlap",
            240,
            torchrun(2, "tools.validation.profile_ulysses_overlap --model minimax_h3 --output {out}/overlap_minimax"),
            "MiniMax H3 layer trace: V copy against Q/K norm+RoPE",
        ),
        Step(
            "overlap_wan",
            240,
            torchrun(2, "tools.validation.profile_ulysses_overlap --model wan2.2-t2v-a14b --output {out}/overlap_wan"),
            "Wan 2.2 T2V-A14B layer trace under Ulysses2, 2 processes sharing the GPU",
        ),
        Step(
            "lingbot",
            420,
            module("tools.bench.lingbot_world_bench session --fusion both --output {out}/lingbot_session.json"),
            "LingBot-World v2 official session, DiT only, fused against eager chains",
        ),
        Step(
            "lingbot_ce",
            420,
            torchrun(
                2,
                "tools.bench.lingbot_world_bench session --layers 8 --ulysses 2 --chunks 3 "
                "--transports ce-ipc,portable --output {out}/lingbot_ce_u2_transports.json",
            ),
            "LingBot-World v2, 8 layers, Ulysses2 over 2 processes: ce-ipc against portable in one run",
        ),
        Step(
            "fp8_minimax",
            590,
            module(
                "tools.bench.fp8_dit_bench --model minimax_h3 --sequential --iters 2 --fp8-attention "
                "--output {out}/fp8_minimax.json"
            ),
            "MiniMax H3 official call: bf16, FP8 GEMMs, FP8 GEMMs + FP8 attention, with relative L2 and cosine",
        ),
        Step(
            "fp8_lingbot",
            420,
            module("tools.bench.fp8_dit_bench --model lingbot_world_v2 --output {out}/fp8_lingbot.json"),
            "LingBot-World v2 official DiT call, bf16 against FP8 GEMMs",
        ),
        Step(
            "fp8_wan",
            420,
            module(
                "tools.bench.fp8_dit_bench --model wan2.2-t2v-a14b --sequential --iters 2 --output {out}/fp8_wan.json"
            ),
            "Wan 2.2 T2V-A14B official step (one expert, the spec's example shape): bf16 against FP8 GEMMs",
        ),
        Step(
            "attn_fp8",
            240,
            module("tools.bench.attention_fp8_bench --output {out}/attention_fp8.json"),
            "cuDNN frontend FP8 attention against cuDNN bf16 (needs .whl/fp8/)",
        ),
        Step(
            "vae",
            300,
            module("tools.bench.wan_vae_bench --output {out}/wan_vae.json"),
            "the Wan VAE's encode and decode per chunk: fp32, bf16, fused norm+SiLU, channels-last",
        ),
        Step(
            "vae_overlap",
            300,
            module(
                "tools.bench.vae_overlap_bench --iters 7 --quantization fp8 --attn-impl cudnn_fp8 "
                "--output {out}/vae_overlap_fp8.json"
            ),
            "does the VAE on another stream hide beside the FP8 DiT?",
        ),
        Step(
            "session_ab",
            600,
            module("tools.bench.lingbot_session_ab --rounds 2 --output {out}/lingbot_session_ab.json"),
            "whole LingBot sessions: the default variants side by side, with quality figures",
        ),
        Step(
            "session_fp8",
            590,
            module(
                "tools.bench.lingbot_session_ab --rounds 1 --variants reuse+fast-vae,fp8+fast-vae,"
                "fp8+fp8-attn+fast-vae --output {out}/lingbot_session_fp8.json"
            ),
            "LingBot sessions with the fast VAE: bf16, FP8 GEMMs, FP8 GEMMs + FP8 attention",
        ),
        Step(
            "diffusers",
            600,
            module("tools.bench.lingbot_world_bench vs-diffusers --output {out}/lingbot_vs_diffusers.json"),
            "ours against diffusers' WanTransformer3DModel, every size",
        ),
        Step(
            "diffusers_fp8",
            420,
            module(
                "tools.bench.lingbot_world_bench vs-diffusers --frames 21 --iters 2 --with-fp8 "
                "--output {out}/lingbot_vs_diffusers_fp8.json"
            ),
            "the same at 32,760 tokens, with ours in FP8 as one more row",
        ),
        Step(
            "e2e",
            480,
            command(f"{RUN_I2V} --device cuda --output {{out}}/lingbot_e2e/session.mp4"),
            "run_i2v at the official size, 77 frames, bf16: MP4 + metrics",
        ),
        Step(
            "e2e_fastest",
            300,
            command(f"{RUN_I2V} --device cuda {FASTEST} --output {{out}}/lingbot_e2e_fastest/session.mp4"),
            "the same with FP8 GEMMs, FP8 attention and the bf16 fast VAE",
        ),
        Step(
            "minimax_e2e",
            420,
            command(f"{RUN_T2VA} --duration 0.2 --resolution 256 --steps 3 --output {{out}}/minimax_e2e/h3.mp4"),
            "run_t2va at the official config, a short clip",
        ),
        Step(
            "minimax_vae",
            600,
            command(f"{RUN_T2VA} --duration 5 --resolution 768 --steps 2 --output {{out}}/minimax_vae/h3.mp4"),
            "run_t2va at 768p 5 s with 2 steps: the MiniMax H3 VAEs at official size, decode time, peak memory",
        ),
        Step(
            "stream_drive",
            590,
            module(
                "tools.bench.stream_drive --config official --device cuda --vae-dtype bfloat16 "
                "--startup-timeout 420 --output {out}/stream_drive_1min.json "
                "--service-log {out}/stream_drive_service.log -- --vae-fast"
            ),
            "serve-stream at the official size driven over its WebSocket for one minute, lossless checks",
        ),
        Step(
            "stream_drive_fastest",
            560,
            module(
                "tools.bench.stream_drive --config official --device cuda --vae-dtype bfloat16 "
                "--startup-timeout 300 --output {out}/stream_drive_fastest_1min.json "
                "--service-log {out}/stream_drive_fastest_service.log "
                "-- --vae-fast --quantization fp8 --attn-impl cudnn_fp8"
            ),
            "the same with FP8 GEMMs and FP8 attention",
        ),
        Step(
            "serve_warmup_off",
            300,
            module(
                "tools.bench.video_service_bench --config official --device cuda --warmup off "
                "--jobs 1344x768:1 1344x768:1 --output {out}/video_service_warmup_off.json "
                "--service-log {out}/video_service_warmup_off_service.log -- --seconds-default 1"
            ),
            "telefuser serve (MiniMax H3, official size): the first jobs after start, warm-up off",
        ),
        Step(
            "serve_warmup_on",
            360,
            module(
                "tools.bench.video_service_bench --config official --device cuda --warmup on "
                f"--jobs 1344x768:1 1344x768:1 1344x768:1 1344x768:2 --prompt {PROMPTS} "
                "--output {out}/video_service_warmup_on.json "
                "--service-log {out}/video_service_warmup_on_service.log -- --seconds-default 1"
            ),
            "the same with the warm-up on, prompts of three lengths",
        ),
    ),
)

# ---- one H200: the Ulysses transport ----------------------------------------------------------------------------
H200_TRANSPORT = Plan(
    "h200-transport",
    "the Ulysses copy-engine transport on one H200: submission cost, GPU suites, fault matrix, correctness",
    (
        TF_KERNEL,
        Step(
            "submission_w2",
            90,
            torchrun(2, "tools.bench.submission_cost --transport ce-ipc"),
            "the host cost of one copy-engine submission, 2 processes (compare with --baseline)",
        ),
        Step(
            "submission_profile",
            90,
            torchrun(2, "tools.bench.submission_cost --transport ce-ipc --profile 30 --label '(profiled)'"),
            "the same with a cProfile of the public calls",
        ),
        Step(
            "tf_kernel_gpu",
            150,
            command("make -C tf-kernel test-gpu PYTHON={py} 'PYTEST_ARGS=-q -rs -s'"),
            "tf-kernel's GPU tests",
        ),
        Step("copy_engine_gpu", 240, pytest("tests/gpu/test_copy_engine_cuda.py"), "the copy-engine GPU suite"),
        Step(
            "fault_matrix_gpu",
            200,
            module("tools.validation.ulysses_fault_matrix --device cuda --output {out}/fault_matrix.md"),
            "faults on one rank x transports, 2 processes sharing the GPU",
        ),
        Step("error_paths", 40, module("tools.validation.tf_kernel_error_paths"), "tf-kernel's refusals"),
        Step(
            "correctness_w4",
            90,
            torchrun(4, "tools.validation.ulysses_correctness --transports portable,ce-ipc --iterations 16"),
            "exact grouped scatter + gather, 4 processes sharing the GPU",
        ),
    ),
    env={"OMP_NUM_THREADS": "4"},
)

# ---- one H200: steady state without the host (CUDA graphs, compiled regions) ------------------------------------
H200_GRAPHS = Plan(
    "h200-graphs",
    "compiled regions and CUDA graphs on one H200: the host out of the steady state",
    (
        *SETUP,
        Step(
            "tests_regions",
            240,
            pytest(
                "-s tests/gpu/test_compiled_regions_cuda.py tests/gpu/test_lingbot_fp8_window_cuda.py "
                "tests/unit/test_fusion.py"
            ),
            "compiled regions, the FP8 window and fusion on CUDA",
        ),
        Step("tests_graphs", 200, pytest("-s tests/gpu/test_lingbot_graphs_cuda.py"), "LingBot CUDA graphs"),
        Step(
            "forward_fp8",
            420,
            module(f"{HOST_BENCH} forward --variants fp8 --output {{out}}/forward_fp8.json"),
            "one LingBot forward per path (eager, regions, graph), FP8",
        ),
        Step(
            "forward_bf16",
            300,
            module(f"{HOST_BENCH} forward --variants bf16 --output {{out}}/forward_bf16.json"),
            "the same in bf16",
        ),
        *(
            Step(
                f"capture_u{w}",
                90,
                torchrun(w, f"tools.bench.ulysses_capture_bench --output {{out}}/capture_u{w}.json"),
                f"the Ulysses exchange captured in a CUDA graph, {w} processes",
            )
            for w in (2, 4)
        ),
        *(
            Step(
                f"ulysses_forward_u{w}",
                200,
                torchrun(
                    w,
                    f"{HOST_BENCH} forward --ulysses {w} --layers 8 --variants fp8 --resolutions 832x480 "
                    f"--output {{out}}/ulysses_forward_u{w}.json",
                ),
                f"the LingBot forward under Ulysses{w}, 8 layers, FP8",
            )
            for w in (2, 4)
        ),
        Step(
            "host_session",
            420,
            module(f"{HOST_BENCH} session --layers 8 --output {{out}}/session.json"),
            "a LingBot session's host time per chunk, 8 layers",
        ),
        Step(
            "host_minimax",
            300,
            module(f"{HOST_BENCH} call --model minimax_h3 --layers 8 --variants bf16 --output {{out}}/minimax.json"),
            "the MiniMax H3 call's host time, 8 layers, bf16",
        ),
        *(
            Step(
                f"official_graphs_{g}",
                300,
                command(
                    f"{RUN_I2V} {FASTEST} --warmup --cuda-graphs {g} --output {{out}}/official_graphs_{g}/session.mp4"
                ),
                f"the official LingBot session, fastest settings, CUDA graphs {g}",
                env={"TORCH_LOGS": "recompiles"},
            )
            for g in ("on", "off")
        ),
    ),
)

# ---- a change against the commit before it ----------------------------------------------------------------------
COMPARE_COMMIT = Plan(
    "compare-commit",
    "the official LingBot session and MiniMax H3 DiT call, in the tree and in .baseline/ (an earlier commit), "
    "interleaved in one call",
    (
        *SETUP,
        Step(
            "lingbot_official",
            420,
            command(f"{RUN_I2V} {FASTEST} --warmup --cuda-graphs on --output {{out}}/lingbot_official/session.mp4"),
            "LingBot-World v2 official session end to end, the fastest settings with CUDA graphs",
        ),
        Step(
            "minimax_official",
            420,
            module("tools.bench.minimax_h3_dit_bench --iters 3 --output {out}/minimax_official.json"),
            "MiniMax H3 official DiT call (768p 5 s), bf16",
        ),
    ),
    baseline=".baseline",
)


# ---- one H200: SageAttention2's SM90 kernel (issue 27) ------------------------------------------------------------
SAGE_SOURCE = ".whl/sage-src"  # a SageAttention 2.2.0 source tree carried to the machine (never part of the project)
SAGE_BUILD = (
    "rm -rf build/sage && mkdir -p build && cp -r {src}/src build/sage && cp {src}/setup_sm90.py build/sage/setup.py "
    "&& cd build/sage && TORCH_CUDA_ARCH_LIST=9.0 NVCC_APPEND_FLAGS='--default-stream per-thread' MAX_JOBS=16 "
    "{{py}} setup.py build_ext --inplace && cp -r sageattention {{site}}/"
).format(src=SAGE_SOURCE)
SAGE_VARIANTS = "reuse+fast-vae,fp8+fp8-attn+fast-vae,fp8+sage+fast-vae"
H200_SAGE = Plan(
    "h200-sage",
    "SageAttention2's SM90 kernel on one H200: its build, GPU tests, the LingBot window, sessions and the gate",
    (
        SETUP[0],
        Step(
            "sage_build",
            300,
            ("bash", "-c", SAGE_BUILD),
            f"build the two SM90 extensions from {SAGE_SOURCE} (per-thread default stream) into the carried site",
            skip_if=command("{py} -c 'import sageattention._qattn_sm90'"),
            setup=True,
        ),
        Step("sage_info", 60, module("telefuser.cli info"), "what `telefuser info` reports of the build"),
        Step(
            "sage_tests",
            420,
            pytest(
                "-s tests/gpu/test_attention_sage_cuda.py tests/gpu/test_attention_auto_cuda.py "
                "tests/gpu/test_compiled_regions_cuda.py "
                "tests/gpu/test_lingbot_graphs_cuda.py -k 'sage or auto'"
            ),
            "the kernel against cuDNN bf16, the quantized LingBot window, its compiled regions and CUDA graphs",
        ),
        Step(
            "sage_bench",
            240,
            module(
                "tools.bench.attention_sage_bench --shapes lingbot --window-writes --profile-writes "
                "--output {out}/sage_bench.json"
            ),
            "the kernel at LingBot's chunk shape and the window writes per layer",
        ),
        Step(
            "lingbot_ab",
            540,
            module(f"tools.bench.lingbot_session_ab --variants {SAGE_VARIANTS} --rounds 1 --output {{out}}/ab.json"),
            "official LingBot sessions: bf16, FP8 GEMMs with cuDNN FP8 attention, FP8 GEMMs with sage_sm90",
        ),
        Step(
            "sage_gate",
            590,
            module(
                "tools.validation.sage_quality_gate --models minimax_h3 lingbot_world_v2 --output {out}/sage_gate.json"
            ),
            "the quality gate: MiniMax H3 and LingBot against cuDNN bf16 attention, random weights and peaky",
        ),
        Step(
            "sage_gate_wan",
            420,
            module(
                "tools.validation.sage_quality_gate --models wan2.2-t2v-a14b --wan-candidates sage_sm90 fp8_sage "
                "--output {out}/sage_gate_wan.json"
            ),
            "the quality gate of a Wan 2.2 T2V-A14B step (480p, 81 frames, CFG batch): sage_sm90 with bf16 and with FP8 "
            "GEMMs against bf16, random weights and peaky (the FP8 candidates without sage: wan-step's wan_fp8_gate)",
        ),
        Step(
            "wan_720p_sage",
            420,
            module(
                "tools.bench.wan2_2_step_bench --resolutions 720p --warmup 1 --iters 3 --attn-impl sage_sm90 "
                "--output {out}/wan_720p_sage.json"
            ),
            "the Wan 2.2 step at 1280x720 with sage_sm90 attention and bf16 GEMMs against diffusers at its best "
            "(compile_repeated_blocks, _native_cudnn), both in one process: the setting sage_gate_wan gates",
        ),
        Step(
            "wan_fp8_sage",
            540,
            module(
                "tools.bench.wan2_2_step_bench --resolutions 480p,720p --warmup 1 --iters 2 --quantization fp8 "
                "--attn-impl sage_sm90 --output {out}/wan_fp8_sage.json"
            ),
            "the step at 832x480 and 1280x720 with FP8 GEMMs and sage_sm90 (sage_gate_wan's fp8_sage) against diffusers "
            "at its best, both in one process: the 1.3x at 720p and the 14B step at 480p (<= 4.7 s) with a gated setting",
        ),
    ),
    calls=(
        "setup_wheels,sage_build,sage_info,sage_tests,sage_bench,lingbot_ab",
        "setup_wheels,sage_build,sage_gate",
        "setup_wheels,sage_build,sage_gate_wan,wan_720p_sage",
        "setup_wheels,sage_build,wan_fp8_sage",
    ),
)


# ---- several GPUs, one rank each --------------------------------------------------------------------------------
def multi_gpu(gpus: int) -> Plan:
    # at 2 GPUs LingBot runs Ulysses2; at 4 and 8 the degrees the issues name. 4-rank test cases need 4 GPUs.
    lingbot_degrees = [2] if gpus == 2 else [w for w in (4, 8) if w <= gpus]
    select = "" if gpus >= 4 else "-k 'not 4procs'"
    ranks_text = "2 and 4 ranks" if gpus >= 4 else "2 ranks"
    per_rank = {"TELEFUSER_TEST_GPU_PER_RANK": "1"}
    backends = (
        "portable,ce-ipc,ce-symm,ce-nocache,ce-pack-flat,ce-handshake-per-tensor,ce-normal-priority,ce-flags32,"
        "ce-symm-barrier"
    )
    steps = [
        TF_KERNEL,
        Step(
            "correctness",
            300,
            torchrun(gpus, "tools.validation.ulysses_correctness --transports portable,ce-ipc,ce-symm --iterations 64"),
            f"exact grouped V/Q/K scatter + gather with rank skew, {gpus} ranks, NCCL / CUDA IPC / SymmMem",
        ),
        Step(
            "gpu_tests_symm",
            420,
            pytest(f"tests/gpu/test_copy_engine_cuda.py {select}"),
            f"the copy-engine suite with {ranks_text}, one GPU each, Symmetric Memory",
            env={**per_rank, "TELEFUSER_TEST_GPU_TRANSPORT": "ce-symm"},
        ),
        Step(
            "gpu_tests_ipc",
            420,
            pytest(f"tests/gpu {select}"),
            f"tests/gpu with {ranks_text}, one GPU each, CUDA IPC",
            env={**per_rank, "TELEFUSER_TEST_GPU_TRANSPORT": "ce-ipc"},
        ),
        Step(
            "model_parity",
            420,
            torchrun(gpus, "tools.validation.model_parity --device cuda --output {out}/model_parity"),
            "every registered model's parallel layouts against dense (the cases that fit), bf16",
        ),
        Step(
            "ab_bench",
            540,
            torchrun(
                gpus,
                f"tools.bench.ulysses_transport_bench --transports {backends} --repeats 5 --output {{out}}/ab_bench.json",
            ),
            "grouped scatter per layer, every backend and ablation, seed shapes + Wan-720p",
        ),
        # alone: NCCL's zero-CTA path has crashed under some torch/NCCL pairs, and a crash must not take other rows
        Step(
            "ab_bench_nccl_zero_cta",
            240,
            torchrun(
                gpus,
                "tools.bench.ulysses_transport_bench --transports portable,nccl-zero-cta --repeats 3 "
                "--output {out}/ab_bench_nccl_zero_cta.json",
            ),
            "NCCL zero-CTA copy-engine all-to-all on symmetric buffers, if this torch/NCCL allows it",
        ),
    ]
    if gpus >= 4:  # the MiniMax TP2+U2 layer and the LingBot U4 layer need 4 ranks
        steps += [
            Step(
                f"overlap_{model}",
                240,
                torchrun(4, f"tools.validation.profile_ulysses_overlap {flags} --output {{out}}/overlap_{model}"),
                f"V copy against Q/K norm+RoPE in a {model} layer",
            )
            for model, flags in (("minimax", "--model minimax_h3 --tp 2"), ("lingbot", "--model lingbot_world_v2"))
        ]
        steps += [
            Step(
                f"minimax_tp2_u{u}",
                540,
                torchrun(
                    2 * u,
                    f"tools.bench.minimax_h3_dit_bench --ulysses {u} --tp 2 --transports {transports} "
                    f"--iters 3 --output {{out}}/minimax_tp2_u{u}.json",
                ),
                f"MiniMax H3 official DiT call, TP2 x Ulysses{u}, transports toggled in one process",
            )
            for u, transports in ((2, "ce-symm,ce-ipc,portable"), (4, "ce-symm,portable"))
            if 2 * u <= gpus
        ]
    for w in lingbot_degrees:
        steps.append(
            Step(
                f"lingbot_u{w}_dit",
                540,
                torchrun(
                    w,
                    f"tools.bench.lingbot_world_bench session --ulysses {w} --transports "
                    f"ce-symm,ce-ipc,portable --output {{out}}/lingbot_u{w}_dit.json",
                ),
                f"LingBot-World v2 DiT session 832x480, Ulysses{w}, transports toggled in one process",
            )
        )
        steps += [
            Step(
                f"lingbot_u{w}_e2e_{transport}",
                420,
                command(
                    f"{{py}} -m torch.distributed.run --standalone --nproc-per-node={w} "
                    f"{RUN_I2V.removeprefix('{py} ')} --ulysses-degree {w} "
                    f"--output {{out}}/lingbot_u{w}_e2e_{transport}/session.mp4"
                ),
                f"LingBot-World v2 end to end 832x480 77 frames, Ulysses{w}, {transport}",
                env={"TELEFUSER_ULYSSES_TRANSPORT": transport},
            )
            for transport in ("ce-symm", "portable")
        ]
    calls = {
        4: (
            "tf_kernel,correctness,gpu_tests_symm,model_parity,ab_bench",
            "tf_kernel,ab_bench_nccl_zero_cta,overlap_minimax,overlap_lingbot,minimax_tp2_u2,lingbot_u4_dit",
            "tf_kernel,lingbot_u4_e2e_ce-symm,lingbot_u4_e2e_portable,gpu_tests_ipc",
        )
    }.get(gpus, ())
    return Plan(
        f"multi-gpu-{gpus}",
        f"every check and measurement of the multi-GPU issues on {gpus} GPUs, one rank per GPU",
        tuple(steps),
        gpus=gpus,
        env=NO_MULTICAST,
        calls=calls,
    )


# ---- one GPU, any size: the official requests within memory budgets (issue 33) -------------------------------------
LINGBOT_FP8 = "--quantization fp8 --attn-impl cudnn_fp8 --cuda-graphs on"
LINGBOT_E2E = f"{RUN_I2V} --warmup --vae-dtype bfloat16 --vae-fast"
MINIMAX_E2E = f"{RUN_T2VA} --steps 9"  # 8 DiT calls: a Turbo-LoRA-sized request


def _budget(gib: int | None) -> str:
    return "" if gib is None else f" --gpu-memory-gb {gib}"


MEMORY = Plan(
    "gpu-memory",
    "both official requests within GPU memory budgets (80 GB: --gpu-memory-gb 78, about what an H100 has free): peaks, "
    "seconds, the plan's estimate against the measured peak",
    (
        Step(
            "setup_wheels",
            240,
            command(
                "{py} -m pip install -q --no-index --no-deps --no-compile --target {site} .whl/*.whl .whl/fp8/*.whl"
            ),
            "the carried wheels (.whl/: diffusers, av; fp8/: cuDNN frontend)",
            setup=True,
        ),
        Step("gpu_streaming", 240, pytest("tests/gpu/test_memory_streaming_cuda.py"), "layer streaming on the GPU"),
        Step(
            "minimax_warm_cache",
            300,
            command(f"{RUN_T2VA} --steps 2 --output {{out}}/minimax_warm_cache/t2va.mp4"),
            "the same request with one DiT call: fills Inductor's on-disk cache, so the runs compared after it all find "
            "it warm (the first process on a fresh machine compiles from a cold cache: docs/perf/2026-12-07)",
        ),
        *(
            Step(
                f"minimax_{gib}",
                420,
                command(f"{MINIMAX_E2E}{_budget(gib)} --output {{out}}/minimax_{gib}/t2va.mp4"),
                f"MiniMax H3 1344x768 5 s, 8 DiT calls, a {gib} GiB budget",
            )
            for gib in (78, 48, 32, 24)
        ),
        Step(
            "minimax_unlimited",
            420,
            command(f"{MINIMAX_E2E} --output {{out}}/minimax_unlimited/t2va.mp4"),
            "the same request with the whole card (an H200: every component resident), the 1.05x reference of the 80 GB "
            "run; run it beside minimax_78 in one call",
        ),
        *(
            Step(
                f"lingbot_{name}",
                360,
                command(f"{LINGBOT_E2E} {flags}{_budget(gib)} --output {{out}}/lingbot_{name}/session.mp4"),
                f"LingBot-World v2 official session, {name}",
            )
            for name, flags, gib in (
                ("bf16_78", "", 78),
                ("fp8_78", LINGBOT_FP8, 78),
                ("fp8_48", LINGBOT_FP8.replace("--cuda-graphs on", "--cuda-graphs auto"), 48),
                ("fp8_32", LINGBOT_FP8.replace("--cuda-graphs on", "--cuda-graphs auto"), 32),
            )
        ),
    ),
    calls=(
        "setup_wheels,gpu_streaming,minimax_78,lingbot_bf16_78,minimax_24,lingbot_fp8_48",
        "setup_wheels,minimax_32,lingbot_fp8_78,minimax_48",
        "setup_wheels,minimax_48,lingbot_fp8_32,lingbot_fp8_78",
        "setup_wheels,minimax_warm_cache,minimax_78,minimax_unlimited",  # on an H200: the 1.05x target
    ),
)

# ---- one GPU: MiniMax H3 as its users run it (issue 34) ------------------------------------------------------------
LORA_BENCH = "{py} -m tools.bench.minimax_h3_lora_bench --device cuda"
TURBO_LORA = "/tmp/h3-turbo/lora_r64.safetensors"  # random rank-64 factors in ai-toolkit's format (not a real Turbo)
KEYFRAMES = (  # two 1344x768 noise images, the first and last keyframes of the FL2VA request
    '{py} -c "import numpy as np; from PIL import Image; g = np.random.default_rng(0); '
    "[Image.fromarray(g.integers(0, 256, (768, 1344, 3), dtype=np.uint8)).save('/tmp/h3-turbo/' + n + '.png') "
    "for n in ('first', 'last')]\""
)
H3_AS_RUN = Plan(
    "h3-as-run",
    "MiniMax H3 as its users run it: rank-64 LoRA merge/unmerge/switch times (bf16, FP8), the official 1344x768 5 s "
    "request with a merged LoRA at 4 steps (T2VA) and 8 steps (FL2VA, two keyframes), default flags",
    (
        MEMORY.steps[0],
        Step(
            "turbo_files",
            120,
            command(f"{{py}} -m tools.bench.minimax_h3_lora_bench --write-lora {TURBO_LORA}"),
            "a random rank-64 LoRA file at the official shapes for the requests below",
            setup=True,
        ),
        Step("keyframes", 60, command(KEYFRAMES), "two keyframe images for the FL2VA request", setup=True),
        Step("lora_bf16", 300, command(f"{LORA_BENCH} --output {{out}}/lora_bf16.json"), "LoRA times, bf16 DiT"),
        Step(
            "lora_fp8",
            300,
            command(f"{LORA_BENCH} --quantization fp8 --output {{out}}/lora_fp8.json"),
            "LoRA times, FP8 DiT (re-quantized from its kept dense weights)",
        ),
        Step(
            "turbo4_t2va",
            420,
            command(f"{RUN_T2VA} --preset turbo-4 --lora {TURBO_LORA} --output {{out}}/turbo4_t2va/t2va.mp4"),
            "the official request, turbo-4 preset, a merged rank-64 LoRA, text only",
        ),
        H200_SAGE.steps[1],
        Step(
            "turbo4_sage_warm",
            480,
            command(
                f"{RUN_T2VA} --preset turbo-4 --lora {TURBO_LORA} --attn-impl sage_sm90 --repeat 2 "
                f"--output {{out}}/turbo4_sage_warm/t2va.mp4"
            ),
            "the turbo-4 request twice on one loaded pipeline with sage_sm90: the second is what a warm service pays",
        ),
        Step(
            "turbo8_fl2va",
            420,
            command(
                f"{RUN_T2VA} --preset turbo-8 --lora {TURBO_LORA} --image /tmp/h3-turbo/first.png "
                f"--last-image /tmp/h3-turbo/last.png --output {{out}}/turbo8_fl2va/t2va.mp4"
            ),
            "the official request, turbo-8 preset, a merged rank-64 LoRA, first and last keyframes (FL2VA)",
        ),
    ),
    calls=(
        "setup_wheels,turbo_files,keyframes,lora_bf16,lora_fp8,turbo4_t2va,turbo8_fl2va",
        "setup_wheels,sage_build,turbo_files,lora_bf16,lora_fp8,turbo4_sage_warm",
    ),
)

# ---- one GPU: a Wan 2.2 step against diffusers, and the other models before/after the Wan base (issue 37) ----------
WAN_STEP = "tools.bench.wan2_2_step_bench"
# The baseline (an earlier commit, .baseline/) may predate the bench: there these steps are skipped, not failed.
WAN_STEP_ABSENT = command("test ! -f tools/bench/wan2_2_step_bench.py")
WAN_STEP_PLAN = Plan(
    "wan-step",
    "a Wan 2.2 T2V-A14B step (one expert, CFG batch, 81 frames, random bf16) at 480p and 720p against diffusers' "
    "WanTransformer3DModel at its best settings, with the official LingBot session and MiniMax H3 DiT call in the "
    "tree and in .baseline/ (before the redesign), interleaved",
    (
        *SETUP,
        Step(
            "wan_480p",
            590,
            module(f"{WAN_STEP} --resolutions 480p --output {{out}}/wan_step_480p.json"),
            "Wan 2.2 T2V-A14B step at 832x480 (32,760 tokens): ours (compiled regions, cuDNN SDPA) against diffusers "
            "(compile_repeated_blocks, _native_cudnn); skipped in a checkout without the bench",
            skip_if=WAN_STEP_ABSENT,
        ),
        Step(
            "wan_720p",
            590,
            module(f"{WAN_STEP} --resolutions 720p --warmup 1 --iters 3 --output {{out}}/wan_step_720p.json"),
            "the same at 1280x720 (75,600 tokens)",
            skip_if=WAN_STEP_ABSENT,
        ),
        Step(
            "wan_720p_fp8",
            590,
            module(
                f"{WAN_STEP} --resolutions 720p --warmup 1 --iters 3 --quantization fp8 --attn-impl cudnn_fp8 "
                "--output {out}/wan_step_720p_fp8.json"
            ),
            "the 720p step with FP8 GEMMs and cuDNN FP8 attention (what wan_fp8_gate gates) against diffusers at its "
            "best, both in one process",
            skip_if=WAN_STEP_ABSENT,
        ),
        Step(
            "wan_720p_fp8_gemm",
            420,
            module(
                f"{WAN_STEP} --resolutions 720p --warmup 1 --iters 2 --quantization fp8 --attn-impl sdpa "
                "--output {out}/wan_step_720p_fp8_gemm.json"
            ),
            "the 720p step with FP8 GEMMs and cuDNN bf16 attention (the FP8 setting that passes wan_fp8_gate) "
            "against diffusers at its best, both in one process",
            skip_if=WAN_STEP_ABSENT,
        ),
        Step(
            "wan_5b_request",
            420,
            command(
                "{py} examples/wan2_2/run_t2v.py --model wan2.2-ti2v-5b --config official --steps 4 "
                "--output {out}/wan_5b/t2v.mp4"
            ),
            "a Wan 2.2 TI2V-5B request as the release runs it (1280x704, 121 frames, random weights) at 4 steps: "
            "load, text, denoise, decode and peak memory",
            skip_if=WAN_STEP_ABSENT,
        ),
        Step(
            "wan_5b_image",
            420,
            command(
                "{py} examples/wan2_2/run_t2v.py --model wan2.2-ti2v-5b --config official --steps 4 "
                "--image examples/lingbot_world_v2/assets/reference.png --output {out}/wan_5b_image/ti2v.mp4"
            ),
            "the same request from a first-frame image (TI2V: the image's latent frame at t = 0, per-token "
            "timesteps): its denoise seconds and peak against wan_5b_request's",
            skip_if=WAN_STEP_ABSENT,
        ),
        *(
            Step(
                f"wan_5b_bf16_vae_{gib}",
                420,
                command(
                    "{py} examples/wan2_2/run_t2v.py --model wan2.2-ti2v-5b --config official --steps 4 "
                    f"--vae-dtype bfloat16 --gpu-memory-gb {gib} --output {{out}}/wan_5b_bf16_vae_{gib}/t2v.mp4"
                ),
                f"the TI2V-5B request with a bfloat16 VAE within {gib} GiB: the tier the plan picks, its estimate "
                "against the measured peak, the decode's seconds against wan_5b_request's",
                skip_if=WAN_STEP_ABSENT,
            )
            for gib in (32, 24)
        ),
        *(
            Step(
                f"wan_a14b_{label}",
                420,
                command(
                    f"{{py}} examples/wan2_2/run_t2v.py --config official --size {size} --steps 3 "
                    f"--output {{out}}/wan_a14b_{label}/t2v.mp4"
                ),
                f"a Wan 2.2 T2V-A14B request at {size}, 81 frames, 3 steps (two high-noise, one low-noise: the "
                "switch), default flags on this card: the memory plan's tier and estimate against the measured peak, "
                "load, text, denoise, decode",
                skip_if=WAN_STEP_ABSENT,
            )
            for label, size in (("480p", "832x480"), ("720p", "1280x720"))
        ),
        Step(
            "wan_a14b_480p_24",
            420,
            command(
                "{py} examples/wan2_2/run_t2v.py --config official --size 832x480 --steps 3 --gpu-memory-gb 24 "
                "--output {out}/wan_a14b_480p_24/t2v.mp4"
            ),
            "the same 480p request within a 24 GiB budget: the block tier (both experts' blocks streamed from pinned "
            "host memory), its estimate against the measured peak, and its denoise seconds against wan_a14b_480p's",
            skip_if=WAN_STEP_ABSENT,
        ),
        Step(
            "wan_fp8_gate",
            420,
            module(
                "tools.validation.sage_quality_gate --models wan2.2-t2v-a14b --wan-candidates fp8 fp8_gemm "
                "--output {out}/wan_fp8_gate.json"
            ),
            "the quality gates of the FP8 Wan steps against bf16, random and peaky weights: FP8 GEMMs with cuDNN FP8 "
            "attention (the 1.35-1.39x step) and FP8 GEMMs alone",
            skip_if=WAN_STEP_ABSENT,
        ),
        COMPARE_COMMIT.step("lingbot_official"),
        COMPARE_COMMIT.step("minimax_official"),
    ),
    baseline=".baseline",
    calls=(
        "setup_wheels,wan_480p,wan_5b_request",
        "setup_wheels,wan_720p",
        "setup_wheels,tf_kernel,lingbot_official,minimax_official",
    ),
)

# ---- one GPU: how soon the picture answers a key (issue 35) ----------------------------------------------------------
STREAM_LATENCY = "tools.bench.stream_latency.client --config official --startup-timeout 480 --presses 8"
STREAM_LATENCY_PLAN = Plan(
    "stream-latency",
    "control-to-display of the official LingBot-World v2 session (random weights, FP8, warm-up on) from the Python "
    "client that plays and timestamps as the page does, over the WebSocket",
    (
        SETUP[0],
        Step(
            "stream_fp8_realtime",
            590,
            module(
                f"{STREAM_LATENCY} --output {{out}}/stream_fp8_realtime.json --service-log {{out}}/service_fp8.log "
                "-- --quantization fp8 --attn-impl cudnn_fp8 --warmup on"
            ),
            "8 presses and releases of W, realtime delivery: p50/p95 control-to-display, in seconds and chunk intervals",
        ),
        Step(
            "stream_fastest_realtime",
            590,
            module(
                f"{STREAM_LATENCY} --output {{out}}/stream_fastest_realtime.json --service-log "
                f"{{out}}/service_fastest.log -- {FASTEST} --cuda-graphs on --warmup on"
            ),
            "the same with LingBot's fastest settings (bf16 fast VAE, CUDA graphs): the service's defaults keep the "
            "fp32 VAE and run graphs only under Ulysses",
        ),
    ),
    calls=("setup_wheels,stream_fp8_realtime,stream_fastest_realtime",),
)

PLANS: dict[str, Plan] = {
    p.name: p
    for p in (
        MEMORY,
        H3_AS_RUN,
        H200_MODELS,
        H200_TRANSPORT,
        H200_GRAPHS,
        H200_SAGE,
        COMPARE_COMMIT,
        WAN_STEP_PLAN,
        STREAM_LATENCY_PLAN,
        multi_gpu(2),
        multi_gpu(4),
        multi_gpu(8),
    )
}
