import os
import random
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, so a test that draws unseeded tensors or builds an
    unseeded model gives the same numbers on every run and in any order."""
    import torch

    random.seed(0)
    torch.manual_seed(0)
    yield
