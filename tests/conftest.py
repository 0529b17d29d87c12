"""Test-wide setup: one intra-op thread per process.

`pytest -n 2` runs two worker processes, and the multi-replica strategies run a thread per
replica inside each; letting torch also start a thread per core would oversubscribe a small
CI machine many times over.
"""

import torch

torch.set_num_threads(1)
