"""How many CUDA GPUs this process would see, without importing torch.

`Cluster.start()` needs the count to plan one engine per GPU, but the notebook should not pay
torch's import (≈ 1.5 s of CPU, competing with the engines' own start on a small machine) just
to count. The driver's NVML library answers in milliseconds; torch's own build metadata
(`torch/version.py`, read as text, not imported) says whether torch can use CUDA at all.
Where neither settles it (a ROCm build of torch), torch is asked as before.

Example:
    >>> visible_entries("1,0", 2)
    ('1', '0')
    >>> visible_entries("0,5,1", 2)      # CUDA stops at the first index past the last GPU
    ('0',)
    >>> visible_entries("", 2)
    ()
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
from pathlib import Path

__all__ = ["nvml_device_count", "torch_gpu_build", "visible_entries", "visible_gpu_ids"]


def torch_gpu_build() -> str | None:
    """`"cuda"`, `"hip"` or None: which GPU runtime the installed torch was built for, read from
    `torch/version.py` without importing torch (None also when torch cannot be found)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for runtime in ("hip", "cuda"):
            match = re.search(rf"^{runtime}\s*(?::[^=]*)?=\s*(.+)$", text, re.MULTILINE)
            if match and match.group(1).strip() not in ("None", "''", '""'):
                return runtime
        return None
    return None


def nvml_device_count() -> int | None:
    """The number of NVIDIA GPUs the driver reports (all of them, ignoring
    `CUDA_VISIBLE_DEVICES`), or None when there is no usable NVML library."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
    except AttributeError:
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        return int(count.value)
    finally:
        nvml.nvmlShutdown()


def visible_entries(visible: str | None, count: int) -> tuple[str, ...]:
    """The entries of `CUDA_VISIBLE_DEVICES` (`visible`; None: unset) naming the GPUs CUDA
    shows on a machine with `count` GPUs, read by torch's rules (`torch.cuda.device_count`
    with NVML): unset, every GPU; a list of UUIDs (`GPU-...`, `MIG-...`) up to the first entry
    without that prefix; else indices, each the leading number of its entry, up to the first
    negative or missing one or the first index past the last GPU. A repeated entry hides
    every GPU."""
    if visible is None:
        return tuple(str(i) for i in range(count))
    chosen: list[str] = []
    prefix = next((p for p in ("GPU-", "MIG-") if visible.startswith(p)), None)
    for raw in visible.split(","):
        if prefix is not None:
            entry = raw
            if entry in chosen:
                return ()
            if not entry.startswith(prefix):
                break
        else:
            digits = re.match(r"[+-]?\d+", raw.strip())
            index = int(digits.group()) if digits else -1
            entry = str(index)
            if entry in chosen:
                return ()
            if index < 0 or index >= count:
                break
        chosen.append(entry)
    return tuple(chosen[:count])


def visible_gpu_ids() -> tuple[str, ...] | None:
    """The `CUDA_VISIBLE_DEVICES` entries of the GPUs torch would see here (all indices when it
    is unset), or None when only torch can tell (a ROCm build). A CPU-only torch, or no
    driver, sees none."""
    runtime = torch_gpu_build()
    if runtime == "hip":
        return None
    if runtime is None:
        return ()
    total = nvml_device_count()
    if not total:
        return ()
    return visible_entries(os.environ.get("CUDA_VISIBLE_DEVICES"), total)
