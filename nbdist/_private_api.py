"""Every private name of another library (torch, ipyparallel, Python) that nbdist uses, in one
place, each with why no public mechanism does the job.

An upgrade that removes or changes one of these breaks `tests/unit/test_private_api.py`, which
names it (`PRIVATE_NAMES`), instead of breaking a user's training somewhere far away. Imports
only the standard library when imported (never ipyparallel: the core imports this module), and
torch at the first use of a name that needs it (`pytree` is a stand-in that imports
`torch.utils._pytree` at its first attribute), so the notebook's `Cluster.start()` never waits
for torch.

Example:
    >>> import torch
    >>> t = torch.zeros(2)
    >>> before = tensor_version(t)
    >>> _ = t.add_(1)
    >>> tensor_version(t) > before
    True
"""

from __future__ import annotations

import datetime
import inspect
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbdist._lazy_module import LazyModule

if TYPE_CHECKING:
    import torch

__all__ = [
    "FOREACH_OPS",
    "PRIVATE_NAMES",
    "c10d_file",
    "client_location",
    "dynamo_frame_hook",  # noqa: F822 (made by `__getattr__`)
    "foreach",
    "gloo_options",
    "launcher_has_exited",
    "pytree",
    "queue_backward_callback",
    "refresh_engines_from_hub",
    "replace_nanny_starter",
    "set_group_timeout",
    "show_elapsed_and_rate",
    "skipped_by_dynamo_like",
    "stop_noting_engine",
    "tensor_version",
    "thread_frames",
]

# name -> why there is no public mechanism (what replaced a private name is listed in
# docs/private-api.md, kept next to this list).
PRIVATE_NAMES: dict[str, str] = {
    "torch.utils._pytree": "nested-structure map/flatten with torch's registered node types "
    "(namedtuples, OrderedDict, user registrations); torch 2.13 ships no public pytree module",
    "torch._foreach_add/_add_/_div_/_mul/_mul_/_maximum/_minimum/_copy_": "one kernel launch "
    "per list of tensors (gradient buckets, per-device reduction); no public multi-tensor API",
    "torch.Tensor._version": "the in-place write counter: the only way to see that a user wrote "
    "a parameter (optimizer step, load_state_dict) without hooking every op",
    "torch.autograd.Variable._execution_engine.queue_callback": "run code once when backward "
    "finishes (close the last gradient bucket); hooks fire per tensor, not at the end",
    "sys._current_frames": "the stack of another thread (is the main thread inside "
    "torch.distributed?); threading and faulthandler give no frame objects",
    "ipyparallel launcher._wait_thread": "whether a launcher's process has exited while "
    "ipyparallel's event loop is not running (its public state changes only on that loop)",
    "ipyparallel.engine.app.start_nanny": "replaced in an engine forked from the zygote "
    "(nbdist/cluster/launch/_engine_main.py) by a function that hands the same arguments to a "
    "nanny forked from the engine, instead of a new Python importing ipyparallel again; "
    "IPEngine has no setting for how its nanny is started",
    "ipyparallel Client._send/_query_stream/_io_loop/_update_engines": "ask the controller which "
    "engines it has registered and record them in the client: a Client hears of new engines "
    "only through its notification socket, which it subscribes after asking for the engine "
    "list, so an engine registering in between is never heard of (it waited forever); "
    "Client has no public refresh",
    "ipyparallel Client._config": "the controller's location (host) as the client read it "
    "from the connection file; Client has no public accessor for it",
    "ipyparallel IPEngine._signal_stop": "the engine's SIGTERM handler: the only place that "
    "knows the engine is being stopped on purpose, so that a normal stop can exit 0",
    "ipyparallel IPController.save_connection_dict": "replaced (nbdist/cluster/"
    "_controller_main.py) to write connection files atomically: ipyparallel writes them in "
    "place and engines polling for them can read half a file; there is no setting for it",
    "ipyparallel HeartMonitor.start/beat, its caller, hearts and on_probation": "wrapped "
    "(nbdist/cluster/launch/_controller_main.py) to beat every 50 ms until every engine "
    "registered: "
    "the controller finishes a registration only at a heartbeat, and its period is fixed",
    "torch._C._dynamo.eval_frame.get_eval_frame_callback": "whether Dynamo watches Python "
    "frames now (a compiled function is running); torch.compiler.is_compiling() is True only "
    "while tracing, and a collective's disable wrapper costs ~10 us per call when nothing runs "
    "compiled",
    "torch.distributed.ProcessGroupGloo._Options": "a gloo group made directly (the "
    "parameter-server pair, outside init_process_group) with its own timeout and the loopback "
    "device: ProcessGroupGloo's constructor takes only these options (_timeout, _devices)",
    "torch.distributed.distributed_c10d._set_pg_timeout": "lengthen the timeout of a formed "
    "group (Note [Held replicas]: the engines enforce the collective timeout themselves, so "
    "it can pause in the debugger); init_process_group's timeout is the only public setting",
    "tqdm._time and tqdm._ema_dt": "show another process's elapsed time and rate on a bar "
    "(an engine's progress drawn in the notebook); tqdm has no public setter for either",
    "torch._dynamo.eval_frame.skip_code and the _torchdynamo_disable* attributes": "make a "
    "wrapper that Dynamo treats exactly as a torch.compiler.disable()d function (graph break "
    "with its reason, frame never traced) without the disable wrapper's per-call cost",
}


pytree: Any = LazyModule("torch.utils._pytree")
"""`torch.utils._pytree`, imported at its first use."""


def tensor_version(tensor: torch.Tensor) -> int:
    """`tensor._version`: how many in-place writes the tensor (or a view of it) has seen."""
    return tensor._version  # noqa: SLF001


def gloo_options(
    timeout: datetime.timedelta, loopback: bool, address: str | None = None
) -> Any:
    """`ProcessGroupGloo._Options` for a group made with `dist.ProcessGroupGloo(store, rank,
    size, options)`: `timeout` for its collectives, on the loopback device (`loopback`, for a
    peer on 127.0.0.1), the device holding `address` (this machine's address that reaches the
    peer), the interface named by `GLOO_SOCKET_IFNAME` when that is set, or the host's default
    one."""
    import os

    import torch.distributed as dist

    gloo = dist.ProcessGroupGloo
    options = gloo._Options()  # noqa: SLF001
    options._timeout = timeout  # noqa: SLF001
    if loopback:
        options._devices = [gloo.create_device(hostname="127.0.0.1")]  # noqa: SLF001
    elif os.environ.get("GLOO_SOCKET_IFNAME"):
        interface = os.environ["GLOO_SOCKET_IFNAME"].split(",")[0]
        options._devices = [gloo.create_device(interface=interface)]  # noqa: SLF001
    elif address:
        options._devices = [gloo.create_device(hostname=address)]  # noqa: SLF001
    else:
        options._devices = [gloo.create_default_device()]  # noqa: SLF001
    return options


def set_group_timeout(timeout: datetime.timedelta, group: Any) -> None:
    """`torch.distributed.distributed_c10d._set_pg_timeout`: the timeout of collectives
    started from now on in the formed `group`."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timeout, group)


def show_elapsed_and_rate(bar: Any, elapsed: float) -> None:
    """Make a tqdm `bar` show `elapsed` seconds and the rate `bar.n / elapsed` (not tqdm's
    smoothed rate of its own updates): for a bar that mirrors another process's progress.

    It also records the bar as drawn now (`last_print_t`): tqdm's `close` writes a bar's final
    line and newline only when the bar was drawn after its start, and a start moved back by
    less than the time since the bar was made (a loop that took microseconds on the engine)
    read as never drawn: the next bar then went on the same line."""
    now = bar._time()  # noqa: SLF001
    bar.start_t = now - elapsed
    bar.last_print_t = now
    bar._ema_dt = lambda: None  # noqa: SLF001


def queue_backward_callback(callback: Callable[[], None]) -> None:
    """Run `callback` once the current backward pass has finished (call during backward)."""
    import torch

    variable = torch.autograd.Variable
    engine = variable._execution_engine  # type: ignore[attr-defined]  # noqa: SLF001
    engine.queue_callback(callback)


def thread_frames() -> dict[int, types.FrameType]:
    """`sys._current_frames()`: the innermost frame of every thread, by thread id."""
    return sys._current_frames()  # noqa: SLF001


def c10d_file() -> str:
    """The source file of `torch.distributed.all_reduce` (frames in it are inside a collective).

    Found from the function itself, not a hard-coded path, so a moved module is followed.
    """
    import torch.distributed as dist

    return inspect.unwrap(dist.all_reduce).__code__.co_filename


def __getattr__(name: str) -> Any:
    """PEP 562: the names that need torch to exist, made at their first import.

    `dynamo_frame_hook()` is None in plain eager code, where `torch.compiler.disable` has
    nothing to disable, and not None while Dynamo intercepts Python frames (inside a
    `torch.compile`d function, even in its eager parts between graphs). A C function on
    purpose: called from a frame Dynamo skips, a Python helper would itself be a frame Dynamo
    traces.

    Example:
        >>> from nbdist._private_api import dynamo_frame_hook
        >>> dynamo_frame_hook() is None
        True
    """
    if name == "dynamo_frame_hook":
        import torch

        hook = torch._C._dynamo.eval_frame.get_eval_frame_callback  # noqa: SLF001
        globals()[name] = hook
        return hook
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def skipped_by_dynamo_like(wrapper: Callable[..., Any], disabled: Callable[..., Any]) -> None:
    """Make Dynamo treat `wrapper` as it treats `disabled` (a `torch.compiler.disable`d
    function): a graph break naming `disabled`'s reason where a compiled function calls it, and
    `wrapper`'s own frame never traced. `wrapper` must call `disabled` whenever
    `dynamo_frame_hook()` is not None, so that what it calls is not traced either, and call no
    other Python function before that test."""
    from torch._dynamo.eval_frame import skip_code

    skip_code(wrapper.__code__)
    for name in _DISABLE_ATTRIBUTES:
        setattr(wrapper, name, getattr(disabled, name))


_DISABLE_ATTRIBUTES = (
    "_torchdynamo_disable",
    "_torchdynamo_disable_msg",
    "_torchdynamo_orig_callable",
    "_torchdynamo_disable_recursive",
)


def launcher_has_exited(launcher: Any) -> bool:
    """True once the thread in which an ipyparallel launcher waits for its process has ended
    (local processes, mpiexec, engines watched over ssh); False where there is none."""
    thread = getattr(launcher, "_wait_thread", None)
    return thread is not None and not thread.is_alive()


def replace_nanny_starter(engine_app: types.ModuleType, start: Callable[..., Any]) -> None:
    """Make ipyparallel's engine start its nanny with `start(**kwargs)`: `engine_app` is the
    module `ipyparallel.engine.app` (passed in: this module imports no ipyparallel), whose
    `start_nanny` the engine calls; `start` must return `(nanny_url, handle)`."""
    engine_app.start_nanny = start  # type: ignore[attr-defined]


def refresh_engines_from_hub(client: Any, timeout: float) -> list[int]:
    """Ask the controller (hub) of an ipyparallel `client` for every engine it has registered,
    record those the client had not heard of, and return the client's engine ids.

    Why: the client learns of engines from notifications on a SUB socket that it connects
    only after it asked the hub for the engines it had; an engine that registered in between
    is in neither (ZeroMQ drops what a SUB socket publishes before it is subscribed), and
    `client.ids` never shows it. Engines forked from a warm zygote register within a second
    of the controller, which is when the client connects. The request goes through the
    client's IO thread, which owns its sockets, and the engines are recorded there.

    Raises:
        TimeoutError: the hub did not answer within `timeout` seconds.
    """
    from concurrent.futures import Future

    reply = client._send(client._query_stream, "connection_request")  # noqa: SLF001
    engines = dict(reply.result(timeout)["content"].get("engines") or {})
    recorded: Future[None] = Future()

    def record() -> None:  # where the client records the engines it hears of
        try:
            client._update_engines(engines)  # noqa: SLF001
        except BaseException as error:
            recorded.set_exception(error)
        else:
            recorded.set_result(None)

    client._io_loop.add_callback(record)  # noqa: SLF001
    recorded.result(timeout)
    return list(client.ids)


def client_location(client: Any) -> str | None:
    """The controller's `location` (its host, as written in the connection file) that an
    ipyparallel `Client` connected with; None when not known."""
    return (getattr(client, "_config", None) or {}).get("location")


def stop_noting_engine(
    engine_class: type,
    busy: Callable[[], bool] = lambda: False,
    exit_now: Callable[[], Any] | None = None,
) -> type:
    """A subclass of ipyparallel's `IPEngine` whose class attribute `stopping` turns True when
    the engine is asked to stop (SIGTERM), through `IPEngine._signal_stop`, its handler.

    When `busy()` says the main thread is running a request, the handler calls `exit_now()`:
    ipyparallel's handler only stops the event loop, which a busy main thread never returns
    to, so the engine would wait for ipyparallel's SIGKILL (5 s later)."""

    class Engine(engine_class):  # type: ignore[misc, valid-type]
        stopping = False

        def _signal_stop(self, sig: int, frame: Any) -> None:
            Engine.stopping = True
            if exit_now is not None and busy():
                exit_now()
            super()._signal_stop(sig, frame)

    return Engine


FOREACH_OPS = ("add", "add_", "copy_", "div_", "maximum", "minimum", "mul", "mul_")


class _Foreach:
    """`torch._foreach_<op>` as `foreach.<op>` (only the ops in `FOREACH_OPS`)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in FOREACH_OPS:
            raise AttributeError(f"nbdist uses no torch._foreach_{name}; add it to FOREACH_OPS")
        import torch

        op = getattr(torch, f"_foreach_{name}")
        setattr(self, name, op)  # later reads find it without calling `__getattr__`
        return op


foreach = _Foreach()
