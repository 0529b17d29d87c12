"""Places where nbdist once differed from TensorFlow, each checked against TF's behaviour.

Each test names the TensorFlow source it follows (distribute_lib.py, values.py, input_lib.py,
cross_device_ops.py, the cluster resolvers). Differences nbdist keeps are in
docs/tf-differences.md.
"""

import json

import pytest
import torch

import nbdist as nd
from nbdist.cluster_resolver import TFConfigClusterResolver, resolve_cluster
from nbdist.errors import ClusterConfigError

TWO = ["cpu:0", "cpu:1"]

IN_PROCESS = [
    pytest.param(lambda: nd.OneDeviceStrategy("cpu"), id="one_device"),
    pytest.param(lambda: nd.MirroredStrategy(TWO), id="mirrored"),
    pytest.param(lambda: nd.CentralStorageStrategy(TWO), id="central_storage"),
    pytest.param(lambda: nd.get_strategy(), id="default"),
]


# -- the default strategy's scope changes no context (distribute_lib._DefaultDistributionStrategy)


def test_the_default_strategys_scope_keeps_the_default_replica_context():
    default = nd.get_strategy()
    outside = nd.get_replica_context()
    with default.scope():
        assert nd.get_strategy() is default
        assert not nd.has_strategy()
        assert not nd.in_cross_replica_context()
        ctx = nd.get_replica_context()
        assert ctx is outside
        assert (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync) == (0, 1)
        assert ctx.strategy is default
        assert torch.equal(ctx.all_reduce("sum", torch.tensor(2.0)), torch.tensor(2.0))
    assert not nd.in_cross_replica_context()


def test_the_default_replica_context_is_one_object():
    assert nd.get_replica_context() is nd.get_replica_context()


def test_merge_call_from_the_default_replica_context_is_cross_replica():
    seen = {}

    def merge_fn(strategy, value):
        seen["cross"] = nd.in_cross_replica_context()
        seen["ctx"] = nd.get_replica_context()
        seen["strategy"] = strategy
        return value * 2

    for enter_scope in (False, True):
        default = nd.get_strategy()
        if enter_scope:
            with default.scope():
                out = nd.get_replica_context().merge_call(merge_fn, args=(torch.tensor(3.0),))
        else:
            out = nd.get_replica_context().merge_call(merge_fn, args=(torch.tensor(3.0),))
        assert seen == {"cross": True, "ctx": None, "strategy": default}
        assert out.item() == 6.0
        assert not nd.in_cross_replica_context()


def test_a_non_default_scope_inside_the_default_one_is_cross_replica():
    strategy = nd.MirroredStrategy(TWO)
    with nd.get_strategy().scope():
        with strategy.scope():
            assert nd.in_cross_replica_context() and nd.get_replica_context() is None


# -- gather of a value that is not distributed (MirroredExtended._gather_to_implementation) ------


@pytest.mark.parametrize("make", IN_PROCESS)
def test_gather_of_a_plain_tensor_returns_it_unchanged(make):
    strategy = make()
    plain = torch.arange(6.0).reshape(3, 2)
    with strategy.scope():
        out = strategy.gather(plain, axis=0)
        nested = strategy.gather({"a": plain, "b": [plain]}, axis=1)
    assert out is plain
    assert nested["a"] is plain and nested["b"][0] is plain


def test_gather_of_a_per_replica_value_still_concatenates():
    strategy = nd.MirroredStrategy(TWO)
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: torch.full((1, 2), float(ctx.replica_id_in_sync_group))
    )
    assert torch.equal(strategy.gather(value, axis=0), torch.tensor([[0.0, 0.0], [1.0, 1.0]]))


# -- TF_CONFIG='{}' is no cluster (TFConfigClusterResolver, _load_tf_config) -------------------


@pytest.mark.parametrize("raw", [None, "", "  ", "{}", " { } ", '{"cluster": {}}'])
def test_an_empty_tf_config_is_no_cluster(raw):
    environ = {} if raw is None else {"TF_CONFIG": raw}
    resolver = TFConfigClusterResolver(environ=environ)
    assert resolver.cluster_spec() == nd.cluster_resolver.ClusterSpec({})
    assert resolver.cluster_spec().as_dict() == {}
    assert (resolver.task_type, resolver.task_id) == (None, None)
    assert resolver.master() == ""
    assert resolve_cluster(environ) is None


def test_an_empty_tf_config_lets_the_next_source_answer():
    environ = {
        "TF_CONFIG": "{}",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    resolver = resolve_cluster(environ)
    assert type(resolver).__name__ == "TorchrunClusterResolver"
    assert resolver.task_id == 1


def test_tf_config_with_only_an_rpc_layer_is_an_empty_cluster():
    resolver = TFConfigClusterResolver(environ={"TF_CONFIG": '{"rpc_layer": "grpc"}'})
    assert resolver.cluster_spec().as_dict() == {}
    assert resolver.rpc_layer == "grpc"
    assert resolver.master() == ""


@pytest.mark.parametrize(
    "config",
    [
        {"task": {"type": "worker", "index": 0}},
        {"task": {"type": "worker", "index": 0}, "rpc_layer": "grpc"},
        {"clusters": {"worker": ["a:1"]}},
    ],
)
def test_tf_config_with_a_task_or_a_typo_but_no_cluster_is_an_error(config):
    environ = {"TF_CONFIG": json.dumps(config)}
    with pytest.raises(ClusterConfigError, match=r"no 'cluster' key.*unset TF_CONFIG"):
        TFConfigClusterResolver(environ=environ)
    with pytest.raises(ClusterConfigError, match=r"no 'cluster' key"):
        resolve_cluster(environ)


def test_multi_worker_strategy_with_empty_tf_config_is_one_local_worker(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TF_CONFIG", "{}")
    strategy = nd.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == 1
    assert strategy.cluster_resolver is None or not strategy.cluster_resolver.cluster_spec().jobs


def test_distribute_values_from_function_returns_the_structure_with_per_replica_leaves():
    # distribute_lib.py: `experimental_distribute_values_from_function` regroups the replicas'
    # values with `distribute_utils.regroup(..., always_wrap=True)`: a dict of PerReplica.
    strategy = nd.MirroredStrategy(TWO)
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: {"id": torch.tensor(float(ctx.replica_id_in_sync_group)), "n": 7}
    )
    assert type(value) is dict
    assert strategy.experimental_local_results(value["n"]) == (7, 7)  # wrapped although equal
    assert strategy.reduce("sum", value, axis=None) == {"id": 1.0, "n": 14}
