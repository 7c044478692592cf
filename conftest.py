import os
import random
import sys

import pytest

# before anything loads torch (and inherited by the fairseq / recipe subprocesses the tests start): idle OpenMP
# threads sleep instead of spinning, so the suite keeps its speed beside a busy process (hf_heads/cli/process.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# cuBLAS's workspace for torch.use_deterministic_algorithms(True) on CUDA (tests/test_device.py); unused on the CPU
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# under pytest-xdist (`make test`), each worker's torch takes its share of the cores, not all of them
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    )

# the tests' helpers (head_cases, hf_families, corpora), imported by name from tests/ and studies/*/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, so a test that draws unseeded tensors or builds an
    unseeded model gives the same numbers on every run and in any order."""
    import torch

    random.seed(0)
    torch.manual_seed(0)
    yield


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="the torch device of the device tier, tests/test_device.py: cpu (make test) or cuda (make test-gpu)",
    )


def pytest_configure(config):
    name = config.getoption("--device")
    if not name.startswith("cuda") and "triton" not in sys.modules:
        # the CPU tier runs the Triton kernels (impl="triton") in triton's interpreter, which triton chooses when it
        # is imported (tests/test_triton_rows.py); nothing else runs a Triton kernel on the CPU
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if name.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            pytest.exit(
                f"--device {name}: the CUDA tier did not run: CUDA is not available here (torch "
                f"{torch.__version__}, built for CUDA {torch.version.cuda or 'none'}, "
                f"{torch.cuda.device_count()} GPUs visible)",
                returncode=0,
            )


@pytest.fixture
def device(request):
    """The device of the device tier (``--device``; cpu by default)."""
    import torch

    return torch.device(request.config.getoption("--device"))
