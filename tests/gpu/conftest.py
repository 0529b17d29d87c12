"""The GPU tests: skipped without CUDA; `scripts/gpu-check.sh` runs them on a GPU machine."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu-check.sh on a GPU machine)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


needs_two_gpus = pytest.mark.skipif(gpu_count() < 2, reason="needs 2 CUDA GPUs")
