"""The Python tests run on ferry's host backend (no GPU: CPU tensors stand in for GPU tensors) and, where
FERRY_TEST_BACKENDS names cuda, on the GPU as well. The package comes from python/ unless one is installed;
the library from FERRY_LIBRARY (ctest and scripts/test.sh set both)."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("ferry") is None:  # not installed and not on PYTHONPATH: the source tree's
    sys.path.insert(0, str(ROOT / "python"))

BACKENDS = [b for b in os.environ.get("FERRY_TEST_BACKENDS", "host").split(",") if b]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def device(backend):
    import ferry
    return ferry.default_device(backend)


@pytest.fixture
def make_tensor(backend):
    """make_tensor(shape, dtype=torch.float32, seed=0): a tensor on the backend's device with values that
    cannot match another seed's by accident."""
    import torch

    def make(shape, dtype=None, seed=0):
        dtype = dtype or torch.float32
        g = torch.Generator().manual_seed(seed)
        if dtype.is_floating_point:
            t = torch.randn(*shape, generator=g).to(dtype)
        else:
            t = torch.randint(0, 100, tuple(shape), generator=g).to(dtype)
        return t.cuda() if backend == "cuda" else t

    return make


def cuda_only(backend):
    if backend != "cuda":
        pytest.skip("needs the cuda backend (FERRY_TEST_BACKENDS=cuda on a GPU machine)")
