"""The notebook does not import torch to start a cluster (its import, about 1.5 s of CPU,
competed with the engine zygote's own on a 2-core machine); it imports it when a result that
holds tensors comes back.

Guarantee checked here: right after `Cluster.start()` returns (the group joined, `strategy`
ready), `torch` is not in the notebook's `sys.modules`; the first `strategy.run` whose result
holds tensors imports it, and the values are right. In a fresh interpreter (this test process
has torch imported already).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.cluster.conftest import STOP_DEADLINE_S, assert_processes_gone

pytestmark = pytest.mark.cluster


def test_start_leaves_torch_unimported_until_a_result_holds_a_tensor(tmp_path):
    probe = textwrap.dedent(
        """
        import json, sys
        import nbdist as nd

        def step():
            import torch
            ctx = nd.get_replica_context()
            return ctx.all_reduce("sum", torch.tensor([1.0, float(ctx.replica_id_in_sync_group)]))

        cluster = nd.Cluster(n=2, timeout=120.0)
        pids = []
        try:
            cluster.start()
            pids = list(cluster.processes)
            after_start = "torch" in sys.modules
            names = [stage.name for stage in cluster.start_report().stages]
            ready = cluster.strategy.num_replicas_in_sync
            out = cluster.strategy.run(step)
            after_run = "torch" in sys.modules
            values = [value.tolist() for value in out.values]
            total = cluster.strategy.reduce("sum", out, axis=None).tolist()
        finally:
            cluster.stop()
        print(json.dumps({"after_start": after_start, "last_stage": names[-1], "ready": ready,
                          "after_run": after_run, "values": values, "total": total,
                          "pids": pids}))
        """
    )
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert_processes_gone(seen.pop("pids"), STOP_DEADLINE_S)
    assert seen == {
        "after_start": False,
        "last_stage": "2 engines joined one torch.distributed group (gloo)",
        "ready": 2,
        "after_run": True,
        "values": [[2.0, 1.0], [2.0, 1.0]],
        "total": [4.0, 2.0],
    }
