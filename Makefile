# The two commands a fresh CPU-only machine needs: `make demo` and `make test`. Each installs what it needs into
# .venv: torch $(TORCH_VERSION) (the CPU wheel on these machines; never a CUDA torch in CI), then this package.
# On a GPU host with a CUDA build of torch already installed, use PYTHON=python3 with the *-gpu targets.

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.telefuser-installed
DEMO_OUT ?= outputs/demo
export OMP_NUM_THREADS ?= 1
# pytest-xdist workers for `make test`; a test file stays on one worker (its module fixtures and servers with it).
PYTEST_WORKERS ?= 2

.PHONY: help install demo demo-attention test test-numerics aiperf-env bench-stream-1min bench-batch test-unit test-gpu build-sm90 build-sage browser services clean

help:
	@echo "make demo        the main job on CPU: a LingBot-World v2 session -> MP4 + metrics (installs into $(VENV))"
	@echo "make demo-attention  one DiT attention layer under Ulysses against dense (2 and 4 CPU ranks)"
	@echo "make test        run the test suite on CPU (installs into $(VENV)), then the numerics tests on portable kernels"
	@echo "make build-sm90  build and install tf-kernel for SM90 (PYTHON=/path/to/python with CUDA torch)"
	@echo "make build-sage SAGE_SRC=path  build SageAttention2's SM90 kernels for --attn-impl sage_sm90 (optional)"
	@echo "make test-gpu    GPU tests on a CUDA host (PYTHON=python3 uses that interpreter's torch)"
	@echo "make bench-stream-1min  AIPerf one-minute lossless LingBot-World v2 stream session (tiny model on CPU)"
	@echo "make bench-batch       AIPerf MiniMax H3 /v1/videos batch run (tiny model on CPU)"
	@echo "make images-check    build both images with podman and smoke-test them (~7 min, ~24 GB disk; not CI)"
	@echo "make deploy-check    the multi-replica deployment from the images, checked across replicas (not CI)"
	@echo "make clean       remove $(VENV), .venv-aiperf, build outputs and demo outputs"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -e ".[dev]"
	@$(PY) -c "import torch; assert torch.__version__.startswith('$(TORCH_VERSION)'), torch.__version__"
	touch $@

install: $(STAMP)

# The main job: one LingBot-World v2 session (77 frames in 5 chunks, tiny random-weight model, CPU), on one rank and
# under Ulysses2 on two gloo ranks. Each writes an MP4 and a metrics JSON.
demo: $(STAMP)
	@echo "== LingBot-World v2: one 77-frame session, tiny random model, 1 CPU rank"
	$(PY) examples/lingbot_world_v2/run_i2v.py --config tiny --device cpu --output $(DEMO_OUT)/lingbot_world_v2.mp4
	@echo "== the same session under Ulysses2 on 2 CPU ranks (gloo)"
	$(VENV)/bin/torchrun --standalone --nproc-per-node=2 examples/lingbot_world_v2/run_i2v.py --config tiny \
	  --device cpu --ulysses-degree 2 --output $(DEMO_OUT)/lingbot_world_v2_u2.mp4

# The first demo: one DiT attention layer under Ulysses (2 and 4 gloo ranks) against dense execution.
demo-attention: $(STAMP)
	@for n in 2 4; do \
	  echo "== Ulysses$$n: one DiT attention layer on $$n CPU ranks (gloo) against dense"; \
	  $(VENV)/bin/torchrun --standalone --nproc-per-node=$$n examples/ulysses_attention/run_attention.py \
	    --output $(DEMO_OUT) || exit 1; \
	done

# ruff format decides the layout (a file it would change fails the run), and ruff check finds defects (undefined
# names, unused imports; the rules are pyproject.toml's [tool.ruff.lint]). CI compiles tf-kernel with the machine's nvcc
# against the CPU torch, so a build break fails CI; its CPU tests
# check registration and argument validation. pytest exits 5 when nothing was collected: a broken suite, not a pass.
# The tests marked `numerics` (float results of different computation orders) then run again under torch's
# portable kernels and AVX2 BLAS/oneDNN, so a test that passes with one CPU's kernels only fails on every host.
PORTABLE_KERNELS = ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2

test: $(STAMP) browser services aiperf-env
	$(PY) -m ruff format --check --quiet telefuser tools tests examples || \
	  { echo "error: run '$(PY) -m ruff format telefuser tools tests examples'"; exit 1; }
	$(PY) -m ruff check --quiet telefuser tools tests examples
	$(MAKE) -C tf-kernel build-sm90 PYTHON=$(abspath $(PY))
	$(MAKE) -C tf-kernel test-cpu PYTHON=$(abspath $(PY)) PYTEST_ARGS=-q
	@$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc
	$(MAKE) test-numerics

test-numerics: $(STAMP)
	@echo "== the numerics tests again under portable CPU kernels ($(PORTABLE_KERNELS))"
	@$(PORTABLE_KERNELS) $(PY) -m pytest -q -m numerics -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: no test carries the numerics marker"; exit 1; fi; exit $$rc

# The streaming service's web page is tested in headless Chromium: Debian's package, no browser download.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser test"; \
	  (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) \
	  || echo "warning: could not install chromium; the browser test will skip with that reason"; }

# The replica tests start their own PostgreSQL cluster and HAProxy on loopback and stop them after: Debian's packages.
# A fresh install may start the packages' own services; those are stopped (the tests never use them).
services:
	@{ command -v haproxy && ls /usr/lib/postgresql/*/bin/initdb; } >/dev/null 2>&1 || { \
	  echo "installing Debian's postgresql and haproxy for the replica tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  (apt-get install -y -q postgresql haproxy >/dev/null 2>&1 || \
	    (apt-get update -q >/dev/null && apt-get install -y -q postgresql haproxy >/dev/null)) \
	  || { echo "error: could not install postgresql and haproxy, which the replica tests need"; exit 1; }; \
	  (service haproxy stop; service postgresql stop) >/dev/null 2>&1 || true; }

# AIPerf 0.13.0 lives in its own environment (.venv-aiperf), never in the engine's: it pins many packages.
AIPERF_VENV ?= .venv-aiperf
BENCH_PY ?= $(PY)
BENCH_MODEL_CONFIG ?= tiny
BENCH_CHECKPOINT ?=
BENCH_NPROC ?= 1
BENCH_DEVICE ?= cpu
BENCH_THREADS ?=
BENCH_ARGS = --config $(BENCH_MODEL_CONFIG) --nproc $(BENCH_NPROC) $(if $(BENCH_DEVICE),--device $(BENCH_DEVICE)) \
  $(if $(BENCH_CHECKPOINT),--checkpoint $(BENCH_CHECKPOINT)) $(if $(BENCH_THREADS),--threads $(BENCH_THREADS))
BENCH_DEPS = aiperf-env $(if $(filter $(PY),$(BENCH_PY)),$(STAMP))

aiperf-env:
	PYTHON=$(PYTHON) tools/aiperf/setup_env.sh

# The one-minute lossless LingBot-World v2 session (957 frames = 60 chunks) and a MiniMax H3 /v1/videos run, each
# checked after the run. Defaults: tiny config on CPU; on a GPU host: BENCH_PY=python3 BENCH_DEVICE= BENCH_NPROC=4
# BENCH_MODEL_CONFIG=official BENCH_CHECKPOINT=/path.
bench-stream-1min: $(BENCH_DEPS)
	$(BENCH_PY) -m tools.aiperf.run_stream_bench --bench-config tools/aiperf/configs/stream_lingbot_world_v2_1min.yaml $(BENCH_ARGS)

bench-batch: $(BENCH_DEPS)
	$(BENCH_PY) -m tools.aiperf.run_batch_bench --bench-config tools/aiperf/configs/batch_minimax_h3.yaml $(BENCH_ARGS)

# On a CUDA host (PYTHON=python3, the interpreter with CUDA torch): build tf-kernel for it, then its GPU tests and ours.
test-gpu: build-sm90
	$(MAKE) -C tf-kernel test-gpu PYTHON=$(PYTHON)
	PYTHONPATH=$(CURDIR) $(PYTHON) -m pytest -rs tests/gpu

build-sm90:
	$(MAKE) -C tf-kernel build-sm90 PYTHON=$(if $(findstring /,$(PYTHON)),$(abspath $(PYTHON)),$(PYTHON))

# SageAttention2 (sage_sm90) from a checkout of its source (SAGE_SRC=path, release 2.2.0), for SM90 only. Its kernels
# launch without a stream argument: --default-stream per-thread puts them on the per-thread stream, which
# telefuser joins to torch's current stream (ops/attention_sage.py refuses a build on the legacy stream).
SAGE_JOBS ?= $(shell nproc)
build-sage:
	@test -n "$(SAGE_SRC)" || { echo "set SAGE_SRC to a SageAttention 2.2.0 source checkout"; exit 2; }
	cd $(SAGE_SRC) && TORCH_CUDA_ARCH_LIST=9.0 NVCC_APPEND_FLAGS="--default-stream per-thread" MAX_JOBS=$(SAGE_JOBS) \
		EXT_PARALLEL=4 $(PYTHON) -m pip install --no-build-isolation --no-deps .
	$(PYTHON) -m telefuser.cli info | grep -A6 sage_sm90_build

# On demand, never in CI: podman builds of docker/ (root, Debian; installs podman, runc and debootstrap if missing).
# KEEP=1 keeps the images, so that a deploy-check after an images-check reuses them. docker/README.md has the results.
.PHONY: images-check deploy-check
images-check:
	bash docker/images-check.sh

deploy-check:
	bash docker/deploy-check.sh

clean:
	rm -rf $(VENV) $(AIPERF_VENV) outputs build dist *.egg-info
