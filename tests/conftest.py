import os
import random
import sys

import pytest

# before anything loads torch (and inherited by the fairseq / recipe subprocesses the tests start): idle OpenMP
# threads sleep instead of spinning, so the suite keeps its speed beside a busy process (hf_heads/threads.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, so a test that draws unseeded tensors or builds an
    unseeded model gives the same numbers on every run and in any order."""
    import torch

    random.seed(0)
    torch.manual_seed(0)
    yield
