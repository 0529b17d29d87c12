"""The abstract `ClusterResolver` and the address helpers every resolver shares.

A cluster resolver tells a multi-worker strategy which cluster it is part of (`cluster_spec()`),
which task this process is (`task_type`, `task_id`), how to reach the master (`master()`) and how
many accelerators a worker has (`num_accelerators()`), as TF's
`tf.distribute.cluster_resolver.ClusterResolver` does.

Example:
    >>> format_master_url("10.0.0.1:2222", rpc_layer="grpc")
    'grpc://10.0.0.1:2222'
    >>> split_address("[::1]:2222", variable="TF_CONFIG")
    ('::1', 2222)
"""

from __future__ import annotations

import abc
from typing import Any

from nbdist.cluster_resolver.cluster_spec import ClusterSpec
from nbdist.errors import ClusterConfigError

__all__ = [
    "ClusterResolver",
    "format_address",
    "format_master_url",
    "local_accelerators",
    "split_address",
    "validate_port",
    "whole_number",
]


class ClusterResolver(abc.ABC):
    """Abstract base of every cluster resolver, as TF's `ClusterResolver`.

    **Implement these:** `cluster_spec()` and `master(task_type, task_id, rpc_layer)`; set
    `self._task_type`, `self._task_id`, `self._rpc_layer` (or override the properties) where
    they apply.

    **Inherited:** `num_accelerators()` (the GPUs this process sees), `task_type`, `task_id`,
    `rpc_layer` (each `None` unless set) and `environment` (`""`: not a Google-internal one).

    Example:
        >>> class OneWorker(ClusterResolver):
        ...     def cluster_spec(self):
        ...         return ClusterSpec({"worker": ["localhost:2222"]})
        ...     def master(self, task_type=None, task_id=None, rpc_layer=None):
        ...         return format_master_url("localhost:2222", rpc_layer)
        >>> resolver = OneWorker()
        >>> resolver.task_type = "worker"
        >>> resolver.task_type, resolver.task_id, resolver.master(rpc_layer="grpc")
        ('worker', None, 'grpc://localhost:2222')
    """

    # -- implement these -----------------------------------------------------------------------

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The cluster as it is now, re-read from its source at every call."""

    @abc.abstractmethod
    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The address of the master task, as `"rpc_layer://host:port"` or `"host:port"`.

        Args:
            task_type: the job of the master task; defaults to the resolver's own.
            task_id: the index of the master task; defaults to the resolver's own.
            rpc_layer: the protocol prefix; defaults to the resolver's `rpc_layer`.
        """

    # -- inherited -----------------------------------------------------------------------------

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """The accelerators per worker, as TensorFlow reports them: `{"GPU": n}`, or `{}`.

        This counts the CUDA devices this process sees (`torch.cuda.device_count()`, which honours
        `CUDA_VISIBLE_DEVICES`); as in TensorFlow, a machine without GPUs gives `{}`. The
        arguments are accepted for TensorFlow compatibility and do not change the answer: a
        process can only count its own devices.

        Args:
            task_type: unused (the task to query in TensorFlow).
            task_id: unused.
            config_proto: unused (a TensorFlow session configuration).

        Example:
            >>> from nbdist.cluster_resolver import TFConfigClusterResolver
            >>> counts = TFConfigClusterResolver(environ={}).num_accelerators()
            >>> counts == {} or counts["GPU"] > 0
            True
        """
        del task_type, task_id, config_proto
        return local_accelerators()

    @property
    def task_type(self) -> str | None:
        """The job of this process (`"worker"`, `"chief"`, `"ps"`, `"evaluator"`…), or `None`."""
        return getattr(self, "_task_type", None)

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The index of this process within its job, or `None`."""
        return getattr(self, "_task_id", None)

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The protocol prefix of `master()` (TensorFlow: `"grpc"`), or `None` for none."""
        return getattr(self, "_rpc_layer", None)

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str:
        """`"google"` inside Google's own infrastructure, else `""` (always `""` here)."""
        return ""


def local_accelerators() -> dict[str, int]:
    """`{"GPU": n}` for the `n` CUDA devices this process sees, or `{}` when it sees none.

    Example:
        >>> set(local_accelerators()) <= {"GPU"}
        True
    """
    import torch  # imported here: resolvers must not import torch when nbdist is imported

    count = torch.cuda.device_count()
    return {"GPU": count} if count else {}


def format_master_url(master: str, rpc_layer: str | None = None) -> str:
    """`master` prefixed by `"rpc_layer://"` when an rpc layer is given (as TensorFlow does).

    Example:
        >>> format_master_url("w0:2222"), format_master_url("w0:2222", "grpc")
        ('w0:2222', 'grpc://w0:2222')
    """
    return f"{rpc_layer}://{master}" if rpc_layer else master


def whole_number(value: Any) -> int | None:
    """`value` as an int when it is one (not a bool) or a string of digits, else None.

    Example:
        >>> whole_number(" 8 "), whole_number(8), whole_number(True), whole_number("8.0")
        (8, 8, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    return None


def validate_port(value: Any, *, variable: str) -> int:
    """`value` as a TCP port: an int (or a string of digits) from 1 to 65535.

    Args:
        value: the port as read (an int or a string).
        variable: what it was read from, named in the error (e.g. `"MASTER_PORT"`).

    Raises:
        ClusterConfigError: (a `ValueError`) not an integer, or outside 1..65535.

    Example:
        >>> validate_port("29500", variable="MASTER_PORT")
        29500
        >>> validate_port("http", variable="MASTER_PORT")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        nbdist.errors.ClusterConfigError: MASTER_PORT has port 'http', which is not an integer...
    """
    port = whole_number(value)
    if port is None and not isinstance(value, bool):  # a bool is out of range, not a non-integer
        raise ClusterConfigError(
            f"{variable} has port {value!r}, which is not an integer. Use a port number from 1 "
            f"to 65535, e.g. 2222."
        )
    if port is None or not 1 <= port <= 65535:
        raise ClusterConfigError(
            f"{variable} has port {value!r}, outside the valid range 1..65535. Use a port "
            f"number from 1 to 65535, e.g. 2222."
        )
    return port


def split_address(address: Any, *, variable: str) -> tuple[str, int]:
    """Split `"host:port"` (or `"[ipv6]:port"`) into a host and a checked port.

    Args:
        address: the address as read.
        variable: what it was read from, named in the error (e.g. `"TF_CONFIG cluster.worker[0]"`).

    Raises:
        ClusterConfigError: (a `ValueError`) not a string, no host, no port, or a bad port.

    Example:
        >>> split_address("worker0.example.com:2222", variable="TF_CONFIG")
        ('worker0.example.com', 2222)
    """
    if not isinstance(address, str) or not address.strip():
        raise ClusterConfigError(
            f"{variable} has address {address!r}; addresses are strings 'host:port', e.g. "
            f"'worker0.example.com:2222'."
        )
    if address.startswith("["):  # [ipv6]:port
        host, sep, port = address[1:].partition("]:")
    else:
        host, sep, port = address.rpartition(":")
    if not sep or not host or any(c.isspace() for c in address):
        raise ClusterConfigError(
            f"{variable} has address {address!r}, which is not 'host:port'. Write the host and "
            f"its port, e.g. 'worker0.example.com:2222' (IPv6: '[::1]:2222')."
        )
    return host, validate_port(port, variable=f"{variable} (address {address!r})")


def format_address(host: str, port: Any, *, variable: str) -> str:
    """`"host:port"` (brackets around an IPv6 host) after checking the port.

    Args:
        host: a host name or IP address.
        port: the port (an int or a string of digits).
        variable: what the port was read from, named in the error.

    Raises:
        ClusterConfigError: (a `ValueError`) an empty host or a bad port.

    Example:
        >>> format_address("node1", 8888, variable="port_base")
        'node1:8888'
        >>> format_address("::1", 80, variable="MASTER_PORT")
        '[::1]:80'
    """
    if not isinstance(host, str) or not host.strip():
        raise ClusterConfigError(
            f"{variable}: host {host!r} is empty or not a string. Give a host name or an IP "
            f"address, e.g. 'node1' or '10.0.0.1'."
        )
    checked = validate_port(port, variable=variable)
    return f"[{host}]:{checked}" if ":" in host else f"{host}:{checked}"
