"""Asynchronous training of a digit classifier with `ParameterServerStrategy`, from `TF_CONFIG`.

One file for every task of the cluster: a `ps` or `worker` task runs `nd.Server(...).join()`
and serves until it is killed; the `chief` creates the strategy and a `ClusterCoordinator`,
schedules 100 functions of 5 SGD steps each on whichever worker is free, and prints the test
accuracy (about 93 %). Uses the digits data bundled with nbdist. From the repository root, one
shell per task (same cluster, different task):

    CLUSTER='"cluster": {"chief": ["127.0.0.1:2220"], "worker": ["127.0.0.1:2221",
             "127.0.0.1:2222"], "ps": ["127.0.0.1:2223"]}'
    TF_CONFIG="{$CLUSTER, \"task\": {\"type\": \"ps\", \"index\": 0}}" \
        python examples/parameter_server_digits.py &
    TF_CONFIG="{$CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
        python examples/parameter_server_digits.py &
    TF_CONFIG="{$CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 1}}" \
        python examples/parameter_server_digits.py &
    TF_CONFIG="{$CLUSTER, \"task\": {\"type\": \"chief\", \"index\": 0}}" \
        python examples/parameter_server_digits.py --functions 100

Kill a worker while the chief runs: its function runs again on the other worker, and the
training still finishes. Start it again and it gets work again.
"""

from __future__ import annotations

import argparse
import time

import nbdist as nd
from nbdist.app import ps_training


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=100, help="functions to schedule")
    parser.add_argument("--steps", type=int, default=5, help="SGD steps per function")
    args = parser.parse_args()

    resolver = nd.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("ps", "worker"):
        nd.Server(
            resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id
        ).join()
        return

    strategy = nd.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = ps_training.build_model()
    coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
    dataset = coordinator.create_per_worker_dataset(ps_training.dataset_fn(batch_size=64))
    iterator = iter(dataset)
    start = time.perf_counter()
    losses = [
        coordinator.schedule(ps_training.train_steps, args=(model, iterator, args.steps))
        for _ in range(args.functions)
    ]
    coordinator.join()
    seconds = time.perf_counter() - start
    workers = sorted({value.worker for value in losses})
    strategy.pull(model)
    print(f"last loss {losses[-1].fetch():.4f}, functions ran on workers {workers}")
    print(f"trained in {seconds:.2f} s; test accuracy {ps_training.evaluate(model):.4f}")
    coordinator.shutdown()
    strategy.close()


if __name__ == "__main__":
    main()
