"""In-process strategies: a training step outside `strategy.run` (cross-replica context) is a
one-device step on the model itself, and the replicas never drift apart because of it."""

from __future__ import annotations

import pytest
import torch

import nbdist as nd
from nbdist.strategies._replicas import iterate_components


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_steps_outside_run_between_run_steps_keep_replicas_identical(momentum):
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    torch.manual_seed(0)
    with strategy.scope():
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)

    def step(x):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        strategy.run(step, args=(x,))
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    grad = torch.autograd.grad(reference(x).pow(2).mean(), list(reference.parameters()))
    step(x)  # outside run: the ordinary one-device gradient of the whole batch
    for p, g in zip(model.parameters(), grad):
        torch.testing.assert_close(p.grad, g)
    for _ in range(2):
        strategy.run(step, args=(x,))
    for components in iterate_components(strategy._replicas):
        for component in components[1:]:
            assert torch.equal(component.detach(), components[0].detach())
