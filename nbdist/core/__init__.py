"""The core: what every layer shares, and nothing of strategies, engines or Jupyter.

Values (`PerReplica`, `Mirrored`), the current strategy and replica context, device
names, variables, and `reduce`: the op, the cross-replica rules, where the replicas
are, and the in-process cross-device algorithms. Imports only
`nbdist.errors` and `nbdist._private_api` from outside itself (docs/architecture.md).
"""
