"""Counting GPUs without importing torch (`nbdist.cluster.launch.gpu_probe`), checked against
torch itself in this process."""

from __future__ import annotations

import pytest
import torch

from nbdist.cluster.launch.gpu_probe import torch_gpu_build, visible_entries, visible_gpu_ids


def test_the_build_read_from_torch_version_py_is_torchs_own():
    expected = "hip" if torch.version.hip else "cuda" if torch.version.cuda else None
    assert torch_gpu_build() == expected


def test_the_visible_gpus_are_the_ones_torch_counts(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert visible_gpu_ids() == tuple(str(i) for i in range(count))


@pytest.mark.parametrize(
    ("visible", "count", "expected"),
    [
        (None, 3, ("0", "1", "2")),
        ("2,0", 3, ("2", "0")),
        ("", 3, ()),
        ("0,7,1", 3, ("0",)),  # CUDA stops at the first index that is not a GPU
        ("1,-1,0", 3, ("1",)),  # and at a negative one
        ("1,0,1", 3, ()),  # a repeated one hides every GPU
        (" 1 , 2gpu", 3, ("1", "2")),  # the leading number of each entry
        ("GPU-8e5c,GPU-77aa,0", 3, ("GPU-8e5c", "GPU-77aa")),
        ("MIG-1,MIG-1", 3, ()),
        ("-1,0", 3, ()),
        (None, 0, ()),
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(visible, count, expected):
    assert visible_entries(visible, count) == expected
