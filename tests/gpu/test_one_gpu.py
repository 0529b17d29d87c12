"""The multi-worker paths a single GPU can check: two workers training on one shared GPU over
gloo (gradient buckets of CUDA tensors, the GPU's 1 MiB first bucket), NCCL refused by name when
workers would share a GPU, and the NCCL process group's checked collectives. Skipped without a
GPU (tests/gpu/conftest.py)."""

from __future__ import annotations

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env

pytestmark = pytest.mark.gpu

SHARED_GPU_TRAINING = r"""
import torch
import torch.nn.functional as F
import nbdist as nd
from nbdist.core.reduce.options import CommunicationImplementation as Impl

options = nd.experimental.CommunicationOptions(implementation=Impl.RING)
strategy = nd.MultiWorkerMirroredStrategy(communication_options=options)
rank = strategy.cluster_resolver.task_id


def build():
    # On a GPU the first bucket closes at 1 MiB (as DDP's): the last layer's 2 MiB of
    # gradients travel in it, while backward computes the first layer's.
    return torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 512)
    )


data = torch.Generator().manual_seed(7)
X = torch.randn(5, 2, 16, 512, generator=data)  # step, worker, batch, features
Y = torch.randint(0, 512, (5, 2, 16), generator=data)

torch.manual_seed(rank)  # different initial weights: the scope broadcasts worker 0's
with strategy.scope():
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
torch.manual_seed(0)
reference = build().cuda()  # one device, the global batch of both workers
reference.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)


def step(x, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


for i in range(5):
    strategy.run(step, args=(X[i, rank].cuda(), Y[i, rank].cuda()))
    ref_optimizer.zero_grad()
    F.cross_entropy(reference(X[i].reshape(32, 512).cuda()), Y[i].reshape(32).cuda()).backward()
    ref_optimizer.step()

torch.cuda.synchronize()
report({
    "backend": strategy.process_group_backend,
    "devices": sorted({str(p.device) for p in model.parameters()}),
    "buckets": [
        [p.shape[0] for p in bucket.params] for bucket in strategy._buckets.buckets
    ],
    "max_diff_from_one_device": max(
        (p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters())
    ),
    "checksums": [p.double().sum().item() for p in model.parameters()],
})
strategy.shutdown()
"""


def _two_workers_on_gpu_0(**extra: str) -> list[dict[str, str]]:
    port = free_port()
    return [
        {**torchrun_env(rank, 2, port), "CUDA_VISIBLE_DEVICES": "0", **extra} for rank in range(2)
    ]


def test_two_workers_share_one_gpu_over_gloo_and_train_like_one_device():
    results = run_workers(SHARED_GPU_TRAINING, _two_workers_on_gpu_0(), timeout=240)
    assert_all_ok(results)
    first, second = (r.result for r in results)
    assert first["backend"] == "gloo"
    assert first["devices"] == ["cuda:0"]
    assert first["buckets"] == [[512, 512], [1024, 1024]], "the GPU's first bucket closes at 1 MiB"
    assert first["checksums"] == second["checksums"], "replicas must stay bit-identical"
    assert first["max_diff_from_one_device"] < 1e-5


NCCL_ON_A_SHARED_GPU = r"""
import nbdist as nd
from nbdist.core.reduce.options import CommunicationImplementation as Impl
from nbdist.errors import InvalidArgumentError

try:
    options = nd.experimental.CommunicationOptions(implementation=Impl[IMPLEMENTATION])
    nd.MultiWorkerMirroredStrategy(communication_options=options)
except InvalidArgumentError as error:
    report({"error": str(error)})
else:
    report({"error": None})
"""


@pytest.mark.parametrize("implementation", ["AUTO", "NCCL"])
def test_nccl_on_a_shared_gpu_is_refused_by_name_on_every_worker(implementation):
    code = NCCL_ON_A_SHARED_GPU.replace("IMPLEMENTATION", repr(implementation))
    results = run_workers(code, _two_workers_on_gpu_0(), timeout=120)
    assert_all_ok(results)
    for result in results:
        message = result.result["error"]
        assert message is not None, "NCCL must not be tried with two ranks on one GPU"
        assert "ranks [0, 1] run on one gpu" in message.lower()
        assert "CommunicationImplementation.RING" in message
        assert "--nproc-per-node" in message


NCCL_GROUP_COLLECTIVES = r"""
import torch
from nbdist.collectives.torch_dist import DistGroup
from nbdist.core.reduce.op import ReduceOp

group = DistGroup(
    rank=0, world_size=1, master_addr="127.0.0.1", master_port=PORT, backend="nccl",
    device=torch.device("cuda:0"), timeout=60,
)
out = {}
summed = group.all_reduce([torch.arange(4.0, device="cuda"), torch.ones(3, device="cuda")],
                          ReduceOp.SUM)
out["all_reduce"] = [t.tolist() for t in summed]
out["all_reduce_devices"] = [str(t.device) for t in summed]
big = torch.full((1 << 20,), 2.0, device="cuda")  # 4 MiB: checked, then reduced
out["all_reduce_tensor"] = group.all_reduce_tensor(big, ReduceOp.MAX)[:3].tolist()
out["all_gather"] = group.all_gather(torch.arange(6.0, device="cuda").reshape(3, 2), 0).tolist()
tensors = [torch.zeros(2, device="cuda")]
group.broadcast_(tensors)
out["broadcast"] = tensors[0].tolist()
flat = torch.ones(5, device="cuda")
group.wait(group.all_reduce_async(flat), "bucket")
out["async"] = flat.tolist()
group.barrier(timeout=30)
out["backend"] = torch.distributed.get_backend()
group.shutdown()
out["initialized_after_shutdown"] = torch.distributed.is_initialized()
report(out)
"""


def test_nccl_process_group_runs_the_checked_collectives():
    code = NCCL_GROUP_COLLECTIVES.replace("PORT", str(free_port()))
    (result,) = run_workers(code, [{}], timeout=180)
    assert_all_ok([result])
    out = result.result
    assert out["backend"] == "nccl"
    assert out["all_reduce"] == [[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]
    assert out["all_reduce_devices"] == ["cuda:0", "cuda:0"]
    assert out["all_reduce_tensor"] == [2.0, 2.0, 2.0]
    assert out["all_gather"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert out["broadcast"] == [0.0, 0.0]
    assert out["async"] == [1.0] * 5
    assert out["initialized_after_shutdown"] is False


SHARDED_ON_A_SHARED_GPU = r"""
import torch
import torch.nn.functional as F
import nbdist as nd
from nbdist.core.reduce.options import CommunicationImplementation as Impl

options = nd.experimental.CommunicationOptions(implementation=Impl.RING)
strategy = nd.experimental.FullyShardedStrategy(min_shard_bytes=1024,
                                                communication_options=options)
rank = strategy.cluster_resolver.task_id


def build():
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh())
                                 for _ in range(4)], torch.nn.Linear(256, 8))


data = torch.Generator().manual_seed(7)
X = torch.randn(5, 2, 16, 256, generator=data)  # step, worker, batch, features
Y = torch.randint(0, 8, (5, 2, 16), generator=data)
torch.manual_seed(rank)
with strategy.scope():
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
initial = [strategy.gather(p).clone() for p in model.parameters()]
reference = build().cuda()  # one device, the global batch of both workers
with torch.no_grad():
    for p, value in zip(reference.parameters(), initial):
        p.copy_(value)
ref_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-3)


def step(x, y):
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


for i in range(5):
    strategy.run(step, args=(X[i, rank].cuda(), Y[i, rank].cuda()))
    ref_optimizer.zero_grad()
    F.cross_entropy(reference(X[i].reshape(32, 256).cuda()), Y[i].reshape(32).cuda()).backward()
    ref_optimizer.step()
torch.cuda.synchronize()
weight = model[0][0].weight
report({
    "backend": strategy.process_group_backend,
    "local": [str(weight.to_local().device), weight.to_local().shape[0], weight.shape[0]],
    "max_diff_from_one_device": max(
        (strategy.gather(p) - q).abs().max().item()
        for p, q in zip(model.parameters(), reference.parameters())
    ),
    "ops": sorted({r.op for r in strategy.extended.telemetry.records()
                   if r.op.startswith(("all_gather:shards", "reduce_scatter"))}),
})
strategy.shutdown()
"""


def test_fully_sharded_strategy_on_one_shared_gpu_trains_like_one_device():
    results = run_workers(SHARDED_ON_A_SHARED_GPU, _two_workers_on_gpu_0(), timeout=240)
    assert_all_ok(results)
    for out in (r.result for r in results):
        assert out["backend"] == "gloo"
        assert out["local"] == ["cuda:0", 128, 256]  # half of each weight's rows, on the GPU
        assert out["max_diff_from_one_device"] < 1e-4
        assert out["ops"] == ["all_gather:shards", "reduce_scatter:AVG"]
