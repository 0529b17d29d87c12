"""Reducing across replicas, one concept in one place: `op` (`ReduceOp`), `rules` (what
`reduce`, `gather`, `reduce_to`, `batch_reduce_to` and `update` do with each kind of
value), `placement` (what the rules need from a strategy: where its replicas are,
and how its workers communicate), `cross_device` (TF's `CrossDeviceOps` for replicas
in one process) and `options` (`CommunicationOptions`: which implementation the
collectives use).
"""
