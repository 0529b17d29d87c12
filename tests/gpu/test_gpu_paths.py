"""The CUDA and NCCL paths: per-replica streams, NcclAllReduce, one engine per GPU pinned, the
NCCL process group and CUDA prefetch. Skipped without a GPU (tests/gpu/conftest.py)."""

from __future__ import annotations

import pytest
import torch

import nbdist as nd
from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.gpu.conftest import gpu_count, needs_two_gpus


def gpus(n: int) -> list[str]:
    return [f"gpu:{i}" for i in range(n)]


def test_each_replica_computes_on_its_own_stream_and_device():
    n = max(1, min(gpu_count(), 2))
    strategy = nd.MirroredStrategy(gpus(n))

    def where():
        stream = torch.cuda.current_stream()
        return torch.tensor(
            [torch.cuda.current_device(), int(stream == torch.cuda.default_stream())]
        )

    out = strategy.experimental_local_results(strategy.run(where))
    assert [int(o[0]) for o in out] == list(range(n))
    assert all(int(o[1]) == 0 for o in out), "replicas must not compute on the default stream"


@needs_two_gpus
@pytest.mark.parametrize(
    "ops",
    [nd.NcclAllReduce(), nd.HierarchicalCopyAllReduce(), nd.ReductionToOneDevice()],
    ids=["nccl", "hierarchical", "to_one_device"],
)
def test_all_reduce_waits_for_the_producing_streams(ops):
    """A long matmul per replica, then an all-reduce: the sum must see the finished products."""
    strategy = nd.MirroredStrategy(gpus(2), cross_device_ops=ops)
    torch.manual_seed(0)
    a = torch.randn(2048, 2048)

    def step():
        ctx = nd.get_replica_context()
        product = (a.cuda() * (ctx.replica_id_in_sync_group + 1)) @ a.cuda()
        return ctx.all_reduce("sum", product)

    expected = (a @ a) * 3
    for total in strategy.experimental_local_results(strategy.run(step)):
        torch.testing.assert_close(total.cpu(), expected, rtol=1e-3, atol=1e-2)


@needs_two_gpus
def test_nccl_all_reduce_cross_device_ops_directly():
    strategy = nd.MirroredStrategy(gpus(2), cross_device_ops=nd.NcclAllReduce())
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: torch.full((4,), float(ctx.replica_id_in_sync_group + 1), device="cuda")
    )
    reduced = strategy.reduce("sum", value, axis=None)
    assert reduced.tolist() == [3.0] * 4


def test_cuda_prefetch_hands_out_batches_on_the_replicas_devices():
    n = max(1, min(gpu_count(), 2))
    strategy = nd.MirroredStrategy(gpus(n))
    data = [torch.arange(8.0).reshape(8, 1) + i for i in range(4)]
    seen = []
    for batch in strategy.experimental_distribute_dataset(data):
        parts = strategy.experimental_local_results(batch)
        seen.append([(p.device.type, p.device.index) for p in parts])
        total = strategy.run(lambda b: b.sum(), args=(batch,))
        assert strategy.reduce("sum", total, axis=None).item() == float(sum(range(8)))
        break
    assert seen[0] == [("cuda", i) for i in range(n)]


NCCL_GROUP = r"""
import torch
import nbdist as nd
options = nd.experimental.CommunicationOptions(implementation="nccl")
strategy = nd.MultiWorkerMirroredStrategy(communication_options=options)
rank = strategy.cluster_resolver.task_id
out = strategy.run(
    lambda: nd.get_replica_context().all_reduce("sum", torch.full((3,), float(rank + 1)))
)
report({"sum": out.tolist(), "device": str(out.device)})
"""


@needs_two_gpus
def test_nccl_process_group_across_two_workers():
    port = free_port()
    envs = [{**torchrun_env(rank, 2, port), "LOCAL_RANK": str(rank)} for rank in range(2)]
    results = run_workers(NCCL_GROUP, envs, timeout=180, fail_fast=True)
    assert_all_ok(results)
    for rank, result in enumerate(results):
        assert result.result["sum"] == [3.0, 3.0, 3.0]
        assert result.result["device"] == f"cuda:{rank}"


def test_one_engine_per_gpu_each_pinned_to_its_own():
    n = min(gpu_count(), 2)
    with nd.Cluster(n=n, gpus="all") as cluster:
        seen = cluster.strategy.run(
            lambda: (torch.cuda.device_count(), torch.cuda.get_device_name(0))
        )
        visible = cluster.strategy.run(lambda: __import__("os").environ["CUDA_VISIBLE_DEVICES"])
        counts = [s[0] for s in cluster.strategy.experimental_local_results(seen)]
        pinned = sorted(cluster.strategy.experimental_local_results(visible))
    assert counts == [1] * n
    assert pinned == [str(i) for i in range(n)]


def test_logging_a_gpu_loss_does_not_wait_for_the_gpu():
    """Note [Logging device tensors]: `nd.log(loss=...)` with a CUDA scalar must not sync; inside
    a CUDA graph capture any sync (`.item()`) raises, so logging there proves it does not."""
    from nbdist.telemetry.metrics import metric_log

    metric_log().clear()
    x = torch.ones(8, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = (x * 2).sum()
        nd.log(step=0, loss=loss)
    graph.replay()
    torch.cuda.synchronize()
    assert metric_log().last("loss") == (0, 0, 16.0)
