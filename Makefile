# The README's two set-up commands: `make demo` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test test-slow test-vllm test-containers lint bench-quick clean

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
	touch $@

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/thundersync-lightning fit --config configs/toy.yaml \
	  --trainer.default_root_dir=runs/demo
	$(VPY) -m thundersync_lightning.summary runs/demo/summary.json

test: $(TEST_STAMP)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(VPY) -m pytest -q

test-slow: $(TEST_STAMP)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(VPY) -m pytest -q -m slow

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
