"""Launching a cluster: the plan (`plan`), ipyparallel's launchers (`launchers`), the
processes' entry points (`_controller_main`, `_engine_main`), watching the parent,
owner-only files, the process set and its logs, and the steps of `Cluster.start`.
"""
