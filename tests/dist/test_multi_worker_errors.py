"""MultiWorkerMirroredStrategy on bad input: a clear error on every worker, in time, never a hang.

Launches start 2 real workers (gloo on CPU); malformed cluster settings are checked in this
process, since the strategy must refuse them before it tries to reach any peer.
"""

from __future__ import annotations

import json
import os
import re
import socket

import pytest
import torch

import nbdist as nd
from nbdist.testing import (
    LOCALHOST,
    assert_all_ok,
    free_port,
    run_workers,
    torchrun_env,
)
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 60

PRELUDE = worker_source("multi_worker_errors_prelude")


def assert_matches(pattern: str, text: str) -> None:
    assert re.search(pattern, text), f"{pattern!r} not found in {text!r}"


def _launch(code: str, tmp_path=None, **extra: str):
    port = free_port()
    if tmp_path is not None:
        extra["DONE_FILE"] = str(tmp_path / "done")
    envs = [{**torchrun_env(rank, 2, port), **extra} for rank in range(2)]
    return run_workers(PRELUDE + code, envs, timeout=LAUNCH_TIMEOUT)


# --- mismatched collectives ------------------------------------------------------------------

MISMATCH = r"""
strategy = nd.MultiWorkerMirroredStrategy(communication_options=Options(timeout_seconds=20))
rank = strategy.cluster_resolver.task_id
run = strategy.run
f32, f64 = torch.float32, torch.float64
out = {
    "shapes": attempt(run, lambda: ctx().all_reduce("sum", torch.ones(3 + rank))),
    "dtypes": attempt(
        run, lambda: ctx().all_reduce("sum", torch.ones(3, dtype=f64 if rank else f32))),
    "structure": attempt(run, lambda: ctx().all_reduce("sum", [torch.ones(2)] * (rank + 1))),
    "ops": attempt(run, lambda: ctx().all_reduce("max" if rank else "sum", torch.ones(2))),
    "kinds": attempt(run, lambda: ctx().all_gather(torch.ones(2), 0) if rank
                     else ctx().all_reduce("sum", torch.ones(2))),
    "gather_other_dim": attempt(run, lambda: ctx().all_gather(torch.ones(2, 3 + rank), 0)),
}
batches = strategy.run(lambda: torch.ones(4 if rank == 0 else 2))
out["reduce_axis_none"] = attempt(strategy.reduce, "sum", batches, None)
out["reduce_axis_0"] = attempt(lambda: strategy.reduce("sum", batches, axis=0).tolist())
wide = strategy.run(lambda: torch.ones(2, 3 + rank))
out["gather_across_workers"] = attempt(strategy.gather, wide, 0)
out["batch_reduce_to"] = attempt(
    strategy.extended.batch_reduce_to, "sum", [(torch.ones(2 + rank), "cpu:0")])
# Bool values are refused by every reduction, on every worker (Note [Bool reductions]).
flags = lambda: torch.tensor([True, rank == 0])
out["bool_all_reduce"] = attempt(run, lambda: ctx().all_reduce("sum", flags()))
out["bool_all_reduce_nested"] = attempt(
    run, lambda: ctx().all_reduce("mean", [torch.ones(3), torch.zeros(70000, dtype=torch.bool)]))
out["bool_reduce"] = attempt(strategy.reduce, "mean", run(flags), None)
out["bool_reduce_axis"] = attempt(strategy.reduce, "sum", run(flags), 0)
out["bool_reduce_to"] = attempt(strategy.extended.reduce_to, "sum", run(flags), "cpu:0")
out["counts"] = run(lambda: ctx().all_reduce("sum", flags().int())).tolist()
# MAX/MIN along an axis that is empty on every worker: TensorFlow's reduce_max of nothing.
as_text = lambda t: [str(x) for x in t.tolist()]
out["empty_max"] = attempt(
    lambda: as_text(strategy.reduce("max", run(lambda: torch.zeros(0, 2)), 0)))
out["empty_min_int"] = attempt(lambda: as_text(strategy.reduce(
    "min", run(lambda: torch.zeros(0, 2, dtype=torch.int32)), 0)))
out["one_empty_max_int"] = attempt(lambda: strategy.reduce("max", run(
    lambda: torch.tensor([[-5, 7]] * rank, dtype=torch.int32).reshape(rank, 2)), 0).tolist())
out["still_usable"] = attempt(
    lambda: run(lambda: ctx().all_reduce("sum", torch.tensor([rank + 1.0]))).tolist())
strategy.shutdown()
report(out)
"""


@pytest.fixture(scope="module")
def mismatch(launch_once) -> list[dict]:
    results = launch_once("errors-mismatch", lambda: _launch(MISMATCH))
    assert_all_ok(results)
    return [result.result for result in results]


MISMATCH_MESSAGES = {
    "shapes": [r"rank 0: .*\(3,\) float32", r"rank 1: .*\(4,\) float32"],
    "dtypes": [r"rank 0: .*\(3,\) float32", r"rank 1: .*\(3,\) float64"],
    "structure": [r"rank 0: .*of 1 tensor", r"rank 1: .*of 2 tensor"],
    "ops": [r"rank 0: all_reduce:SUM", r"rank 1: all_reduce:MAX"],
    "kinds": [r"rank 0: all_reduce:SUM", r"rank 1: all_gather:0"],
    "gather_other_dim": [r"rank 0: .*float32", r"rank 1: .*float32", r"axis 0"],
}


@pytest.mark.parametrize("case", sorted(MISMATCH_MESSAGES))
def test_mismatched_collective_raises_on_every_worker_naming_both(mismatch, case):
    for out in mismatch:
        error = out[case]
        assert error["type"] == "CollectiveMismatchError", error
        assert "ValueError" in error["bases"]
        for pattern in MISMATCH_MESSAGES[case]:
            assert_matches(pattern, error["message"])
        assert error["elapsed"] < 5  # checked before the launch: no waiting for the timeout


def test_all_gather_mismatch_names_the_real_shapes(mismatch):
    for out in mismatch:
        for case in ("gather_other_dim", "gather_across_workers"):
            message = out[case]["message"]
            assert_matches(r"rank 0: .*\(2, 3\)", message)
            assert_matches(r"rank 1: .*\(2, 4\)", message)


def test_cross_replica_reduce_and_gather_of_mismatched_workers_raise_value_error(mismatch):
    for out in mismatch:
        error = out["reduce_axis_none"]
        assert "ValueError" in error["bases"], error
        assert_matches(r"\(4,\)", error["message"])
        assert_matches(r"\(2,\)", error["message"])
        assert out["reduce_axis_0"]["result"] == 6.0  # lengths may differ along the axis
        for case in ("gather_across_workers", "batch_reduce_to"):
            error = out[case]
            assert "ValueError" in error["bases"], error
            assert_matches("rank 0", error["message"])
            assert_matches("rank 1", error["message"])
            assert error["elapsed"] < 5


def test_bool_reductions_are_refused_on_every_worker_and_counts_work(mismatch):
    cases = ["bool_all_reduce", "bool_all_reduce_nested", "bool_reduce", "bool_reduce_axis",
             "bool_reduce_to"]  # fmt: skip
    for out in mismatch:
        for case in cases:
            error = out[case]
            assert error.get("type") == "ArgumentTypeError", (case, error)
            assert "TypeError" in error["bases"]
            assert_matches(r"Cannot reduce a bool tensor with (SUM|MEAN).*`t.int\(\)`",
                           error["message"])  # fmt: skip
            assert error["elapsed"] < 5
        assert out["counts"] == [2, 1]


def test_empty_max_min_along_an_axis_are_tfs_identities_across_workers(mismatch):
    for out in mismatch:
        assert out["empty_max"]["result"] == ["-inf", "-inf"]
        assert out["empty_min_int"]["result"] == [str(2**31 - 1)] * 2
        assert out["one_empty_max_int"]["result"] == [-5, 7]


def test_group_is_still_usable_after_mismatches(mismatch):
    for out in mismatch:
        assert out["still_usable"]["result"] == [3.0]


# --- a collective only one worker calls ------------------------------------------------------

ONE_SIDED = r"""
per_call = VARIANT == "per_call"
options = None if per_call else Options(timeout_seconds=5)
strategy = nd.MultiWorkerMirroredStrategy(communication_options=options)
rank = strategy.cluster_resolver.task_id
out = {}
if VARIANT == "after_recovered_error":
    # A mismatch both workers recover from, then a good collective: the group is healthy.
    out["recovered"] = attempt(strategy.run, lambda: ctx().all_reduce("sum", torch.ones(3 + rank)))
    out["good"] = strategy.run(lambda: ctx().all_reduce("sum", torch.ones(1))).tolist()


def step():
    if rank == 1:
        return "returned without the collective"
    call_options = Options(timeout_seconds=3) if per_call else None
    return ctx().all_reduce("sum", torch.ones(2), options=call_options).tolist()


out["step"] = attempt(strategy.run, step)
finish(rank)
report(out)
"""


@pytest.mark.parametrize(
    ("variant", "timeout"),
    [
        ("strategy_wide", 5),
        ("per_call", 3),
        ("after_recovered_error", 5),
    ],
)
def test_collective_called_on_one_worker_times_out_naming_the_other(tmp_path, variant, timeout):
    results = _launch(ONE_SIDED, tmp_path, VARIANT=variant)
    assert_all_ok(results)
    first, second = (result.result for result in results)
    assert second["step"]["result"] == "returned without the collective"
    error = first["step"]
    assert error["type"] == "CollectiveTimeoutError", error
    assert "TimeoutError" in error["bases"]
    assert error["missing"] == [1]
    assert_matches(r"rank 1\b", error["message"])
    assert timeout * 0.9 <= error["elapsed"] < timeout + 5
    if variant == "after_recovered_error":
        assert first["good"] == second["good"] == [2.0]


# --- a worker that dies or fails mid-step -------------------------------------------------------

DIES = r"""
strategy = nd.MultiWorkerMirroredStrategy(communication_options=Options(timeout_seconds=30))
rank = strategy.cluster_resolver.task_id
dying = int(VARIANT)
out = {"first": strategy.run(lambda: ctx().all_reduce("sum", torch.ones(1))).tolist()}


def step():
    if rank == dying:
        os._exit(1)
    return ctx().all_reduce("sum", torch.ones(2))


out["step"] = attempt(strategy.run, step)
out["next"] = attempt(strategy.run, lambda: ctx().all_reduce("sum", torch.ones(2)))
report(out)
"""


@pytest.mark.parametrize("dying", [1, 0], ids=["rank1-dies", "rank0-dies"])
def test_worker_that_exits_mid_step_is_named_on_the_survivor_quickly(dying):
    results = _launch(DIES, VARIANT=str(dying))
    survivor = 1 - dying
    assert results[dying].returncode == 1 and not results[dying].timed_out
    assert_all_ok([results[survivor]])
    out = results[survivor].result
    assert out["first"] == [2.0]
    error = out["step"]
    assert error["type"] == "WorkerLostError", error
    assert "RuntimeError" in error["bases"]
    assert error["missing"] == [dying]
    assert_matches(rf"rank {dying}\b", error["message"])
    assert error["elapsed"] < 10  # well before the 30 s timeout
    # The group is unusable now: the next collective fails at once, it does not hang.
    assert out["next"]["type"] == "WorkerLostError"
    assert out["next"]["elapsed"] < 1


RAISES = r"""
caught = VARIANT == "caught"
options = Options(timeout_seconds=5 if caught else 30)
strategy = nd.MultiWorkerMirroredStrategy(communication_options=options)
rank = strategy.cluster_resolver.task_id


def step():
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    return ctx().all_reduce("sum", torch.ones(2))


if rank == 1 and not caught:
    strategy.run(step)  # the traceback ends this worker
out = {"step": attempt(strategy.run, step)}
finish(rank)
report(out)
"""


@pytest.mark.parametrize(("variant", "limit"), [("uncaught", 10), ("caught", 5 + 5)])
def test_exception_in_one_workers_step_is_named_by_the_other(tmp_path, variant, limit):
    results = _launch(RAISES, tmp_path, VARIANT=variant)
    assert_all_ok([results[0]])
    error = results[0].result["step"]
    assert error["type"] == "WorkerLostError", error
    assert error["missing"] == [1]
    assert_matches(r"rank 1 raised an error", error["message"])
    assert_matches(r"ValueError: .*bad batch on rank 1", error["message"])
    assert error["elapsed"] < limit
    if variant == "uncaught":
        assert results[1].returncode == 1
        assert "ValueError: [replica 1 of 2] bad batch on rank 1" in results[1].stderr
    else:
        assert_all_ok([results[1]])
        raised = results[1].result["step"]
        assert raised["type"] == "ValueError"
        assert raised["message"] == "[replica 1 of 2] bad batch on rank 1"


# --- rendezvous ----------------------------------------------------------------------------------

RENDEZVOUS = r"""
started = time.monotonic()
try:
    nd.MultiWorkerMirroredStrategy(communication_options=Options(timeout_seconds=2))
    report({"type": None})
except Exception as error:
    report(describe(error, started))
"""


def test_port_in_use_and_workers_that_never_join_raise_rendezvous_error():
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        held.bind((LOCALHOST, 0))
        held.listen()
        port = held.getsockname()[1]
        envs = [
            torchrun_env(0, 2, port),  # rank 0 cannot host the rendezvous
            torchrun_env(0, 2, free_port()),  # rank 0 alone: rank 1 never joins
            torchrun_env(1, 2, free_port()),  # rank 1 alone: nobody hosts the rendezvous
        ]
        results = run_workers(PRELUDE + RENDEZVOUS, envs, timeout=LAUNCH_TIMEOUT)
    finally:
        held.close()
    assert_all_ok(results)
    in_use, alone, unhosted = (result.result for result in results)
    for error in (in_use, alone, unhosted):
        assert error["type"] == "RendezvousError", error
        assert "RuntimeError" in error["bases"]
    assert_matches(rf"\b{port}\b", in_use["message"])
    assert_matches("in use", in_use["message"])
    assert in_use["elapsed"] < 3  # no waiting: the port is taken
    assert_matches(r"\[1\]", alone["message"])
    assert 2 * 0.9 <= alone["elapsed"] < 2 + 5
    assert_matches(str(envs[2]["MASTER_PORT"]), unhosted["message"])
    assert unhosted["elapsed"] < 2 + 7


# --- malformed cluster settings (in this process: refused before any connection) ---------------

CLUSTER_VARIABLES = ("TF_CONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name in CLUSTER_VARIABLES or name.startswith(("MASTER_", "SLURM_", "TORCHELASTIC_")):
            monkeypatch.delenv(name)
    return monkeypatch


def _tf_config(task: dict, cluster: dict | None = None) -> str:
    # Ports 1 and 2 cannot be bound: if a check were missing, the strategy would fail to host
    # the rendezvous (RendezvousError) instead of waiting for peers.
    workers = [f"{LOCALHOST}:1", f"{LOCALHOST}:2"]
    return json.dumps({"cluster": cluster or {"worker": workers}, "task": task})


def _strategy(**options) -> nd.MultiWorkerMirroredStrategy:
    # A short timeout, so a check that is missing fails the test instead of hanging it.
    options.setdefault("timeout_seconds", 2)
    return nd.MultiWorkerMirroredStrategy(
        communication_options=nd.experimental.CommunicationOptions(**options)
    )


@pytest.mark.parametrize(
    ("tf_config", "pattern"),
    [
        ('{"cluster": {"worker": ["127.0.0.1:1"]', r"TF_CONFIG.*JSON"),
        ('{"task": {"type": "worker", "index": 0}}', r"TF_CONFIG.*cluster"),
        ('["worker"]', r"TF_CONFIG.*object"),
        (_tf_config({"type": "worker", "index": 2}), r"TF_CONFIG.*\b2\b"),
        (_tf_config({"type": "trainer", "index": 0}), r"TF_CONFIG.*trainer"),
        (_tf_config({"type": "worker", "index": 0}, {"worker": ["127.0.0.1:99999"]}), "TF_CONFIG"),
        (_tf_config({"type": "worker", "index": 0}, {"worker": ["no-port"]}), "TF_CONFIG"),
    ],
    ids=[
        "not-json",
        "no-cluster",
        "not-object",
        "index-past-job",
        "unknown-type",
        "bad-port",
        "no-port",
    ],
)
def test_bad_tf_config_raises_value_error_naming_it(clean_env, tf_config, pattern):
    clean_env.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ValueError, match=pattern):
        _strategy()


def test_ps_task_is_refused(clean_env):
    cluster = {"worker": [f"{LOCALHOST}:1"], "ps": [f"{LOCALHOST}:2"]}
    clean_env.setenv("TF_CONFIG", _tf_config({"type": "ps", "index": 0}, cluster))
    with pytest.raises(ValueError, match="'ps'"):
        _strategy()


def test_world_size_disagreeing_with_tf_config_raises_value_error(clean_env):
    clean_env.setenv("TF_CONFIG", _tf_config({"type": "worker", "index": 0}))
    clean_env.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"WORLD_SIZE.*3.*2 worker"):
        _strategy()


def test_bad_torchrun_variables_raise_value_error(clean_env):
    for name, value in torchrun_env(0, 2, free_port()).items():
        clean_env.setenv(name, value)
    clean_env.setenv("RANK", "2")
    with pytest.raises(ValueError, match=r"RANK is 2.*WORLD_SIZE is 2"):
        _strategy()


@pytest.mark.skipif(torch.cuda.is_available(), reason="NCCL is valid with a GPU")
@pytest.mark.parametrize("cluster", ["single-worker", "torchrun"])
def test_nccl_on_cpu_raises_value_error(clean_env, cluster):
    if cluster == "torchrun":
        for name, value in torchrun_env(0, 2, free_port()).items():
            clean_env.setenv(name, value)
    with pytest.raises(ValueError, match=r"NCCL.*(RING|gloo)"):
        _strategy(implementation="NCCL")
    with pytest.raises(ValueError, match=r"NCCL.*(RING|gloo)"):
        _strategy(implementation=nd.experimental.CommunicationImplementation.NCCL)
