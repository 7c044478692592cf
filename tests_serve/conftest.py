"""The serving tests run in the environment `make serve-env` builds (vLLM's CPU build pins its own transformers):
`make test-serve`. Each head is served once, the families rotated; `--every-family` serves each head on each family."""

import os

# vLLM's CPU backend on a shared machine: 1 GiB of KV cache (not 92% of the RAM), threads left unbound, no telemetry
for key, value in {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(key, value)


def pytest_addoption(parser):
    parser.addoption("--every-family", action="store_true", help="serve every head on every family (slow)")
