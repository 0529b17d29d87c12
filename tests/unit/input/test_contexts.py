"""nbdist.input's InputContext, ValueContext and InputOptions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nbdist.input import InputContext, InputOptions, InputReplicationMode, ValueContext


def test_input_context():
    ctx = InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (2, 1, 4)
    assert ctx.get_per_replica_batch_size(64) == 16
    assert ctx.get_per_replica_batch_size(np.int64(8)) == 2
    assert str(ctx) == "nbdist.InputContext(input pipeline id 1, total: 2)"
    assert repr(ctx) == (
        "InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)"
    )
    default = InputContext()
    assert (default.num_input_pipelines, default.input_pipeline_id) == (1, 0)
    assert default.num_replicas_in_sync == 1


def test_value_context():
    ctx = ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=3)
    assert (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync) == (2, 3)
    assert str(ctx) == "nbdist.ValueContext(replica id 2, total replicas in sync: 3)"
    assert repr(ctx) == "ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=3)"
    assert ValueContext().num_replicas_in_sync == 1


def test_input_options_defaults_and_normalisation():
    options = InputOptions()
    assert options.experimental_fetch_to_device is True
    assert options.experimental_replication_mode is InputReplicationMode.PER_WORKER
    assert options.experimental_place_dataset_on_device is False
    assert options.experimental_per_replica_buffer_size == 1
    assert InputOptions(experimental_fetch_to_device=None).experimental_fetch_to_device is True
    mode = InputOptions(experimental_replication_mode="per_replica").experimental_replication_mode
    assert mode is InputReplicationMode.PER_REPLICA
    assert InputReplicationMode.PER_WORKER.value == "PER_WORKER"
    assert InputReplicationMode("PER_REPLICA") is InputReplicationMode.PER_REPLICA
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.experimental_fetch_to_device = False
    with pytest.raises(TypeError):
        InputOptions(False)
