"""Every private name of torch, ipyparallel and Python that nbdist uses (nbdist/_private_api.py)
still exists and still does what nbdist relies on; a failure names the name and what uses it."""

from __future__ import annotations

import collections
import datetime
import inspect
import io
import sys
import threading

import pytest
import torch
import torch.distributed as dist

from nbdist import _private_api as private


def test_every_listed_name_is_checked_here():
    checked = {
        "torch.utils._pytree", "torch.Tensor._version", "sys._current_frames",
        "torch._foreach_add/_add_/_div_/_mul/_mul_/_maximum/_minimum/_copy_",
        "torch.autograd.Variable._execution_engine.queue_callback",
        "ipyparallel launcher._wait_thread", "ipyparallel IPEngine._signal_stop",
        "ipyparallel IPController.save_connection_dict", "ipyparallel Client._config",
        "ipyparallel Client._send/_query_stream/_io_loop/_update_engines",
        "ipyparallel.engine.app.start_nanny",
        "ipyparallel HeartMonitor.start/beat, its caller, hearts and on_probation",


        "torch._C._dynamo.eval_frame.get_eval_frame_callback",
        "torch._dynamo.eval_frame.skip_code and the _torchdynamo_disable* attributes",
        "torch.distributed.ProcessGroupGloo._Options", "tqdm._time and tqdm._ema_dt",
        "torch.distributed.distributed_c10d._set_pg_timeout",
    }  # fmt: skip
    assert set(private.PRIVATE_NAMES) == checked, "a private name was added without a check"


def test_torch_utils_pytree_maps_and_flattens_nested_structures():
    assert hasattr(private.pytree, "tree_map"), "torch.utils._pytree.tree_map is gone"
    leaves, spec = private.pytree.tree_flatten({"a": (1, [2, 3])})
    assert leaves == [1, 2, 3], "torch.utils._pytree.tree_flatten changed its leaf order"
    assert private.pytree.tree_unflatten([4, 5, 6], spec) == {"a": (4, [5, 6])}
    # select_replica skips the walk for values whose type is no registered node type.
    nodes = getattr(private.pytree, "SUPPORTED_NODES", None)
    assert isinstance(nodes, dict), "torch.utils._pytree.SUPPORTED_NODES is gone"
    assert {list, dict, collections.OrderedDict} <= set(nodes), "SUPPORTED_NODES changed"


@pytest.mark.parametrize("op", private.FOREACH_OPS)
def test_torch_foreach_op_exists(op):
    assert callable(getattr(torch, f"_foreach_{op}", None)), f"torch._foreach_{op} is gone"
    xs = [torch.ones(2), torch.ones(3)]
    if op == "copy_":
        private.foreach.copy_(xs, [torch.zeros(2), torch.zeros(3)])
        assert all(bool((x == 0).all()) for x in xs), "torch._foreach_copy_ no longer copies"
    elif op.endswith("_"):
        getattr(private.foreach, op)(xs, 2.0)
        assert xs[0].tolist() != [1.0, 1.0], f"torch._foreach_{op} no longer works in place"
    else:
        out = getattr(private.foreach, op)(xs, [torch.ones(2), torch.ones(3)])
        assert [t.shape for t in out] == [torch.Size([2]), torch.Size([3])]


def test_tensor_version_counts_in_place_writes():
    t = torch.zeros(3)
    assert hasattr(t, "_version"), "torch.Tensor._version is gone"
    before = private.tensor_version(t)
    t.view(-1).add_(1)  # a write through a view counts too
    assert private.tensor_version(t) > before, "torch.Tensor._version no longer counts writes"


def test_queue_backward_callback_runs_after_backward():
    assert hasattr(torch.autograd.Variable, "_execution_engine"), (
        "torch.autograd.Variable._execution_engine is gone"
    )
    seen = []
    x = torch.ones(2, requires_grad=True)
    x.register_hook(lambda g: private.queue_backward_callback(lambda: seen.append(x.grad)))
    (x * 3).sum().backward()
    assert len(seen) == 1, "Variable._execution_engine.queue_callback did not run once"
    assert seen[0] is not None and seen[0].tolist() == [3.0, 3.0]  # ran after accumulation


def test_thread_frames_show_another_threads_stack():
    assert hasattr(sys, "_current_frames"), "sys._current_frames is gone"
    started, release = threading.Event(), threading.Event()

    def waiting_here():
        started.set()
        release.wait(30)

    thread = threading.Thread(target=waiting_here)
    thread.start()
    try:
        assert started.wait(30)
        frame = private.thread_frames()[thread.ident]
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        assert "waiting_here" in names, "sys._current_frames no longer shows other threads"
    finally:
        release.set()
        thread.join(30)


def test_c10d_file_is_where_torch_distributed_collectives_live():
    path = private.c10d_file()
    assert path.endswith(".py") and "torch" in path
    for name in ("all_reduce", "broadcast", "all_gather_into_tensor", "barrier"):
        code = inspect.unwrap(getattr(dist, name)).__code__
        assert code.co_filename == path, f"torch.distributed.{name} moved out of {path}"


def test_gloo_options_make_a_direct_gloo_group_with_its_timeout():
    assert hasattr(dist.ProcessGroupGloo, "_Options"), "ProcessGroupGloo._Options is gone"
    options = private.gloo_options(datetime.timedelta(seconds=7), loopback=True)
    assert options._timeout == datetime.timedelta(seconds=7), "_Options._timeout changed"
    assert len(options._devices) == 1, "_Options._devices changed"
    store = dist.HashStore()
    group = dist.ProcessGroupGloo(store, 0, 1, options)  # a one-rank group: no peer to wait for
    t = torch.ones(2)
    group.allreduce([t]).wait()
    assert t.tolist() == [1.0, 1.0], "a gloo group made from _Options no longer reduces"


def test_set_group_timeout_changes_a_formed_gloo_groups_timeout():
    import subprocess

    script = (
        "import datetime, torch, torch.distributed as dist\n"
        "from nbdist import _private_api as private\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1,\n"
        "                        timeout=datetime.timedelta(seconds=5))\n"
        "private.set_group_timeout(datetime.timedelta(seconds=77), dist.group.WORLD)\n"
        "print(dist.group.WORLD._get_backend(torch.device('cpu')).options._timeout)\n"
        "dist.destroy_process_group()\n"
    )  # a process of its own: init_process_group is once per process
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0:01:17", "_set_pg_timeout no longer sets the gloo timeout"


def test_show_elapsed_and_rate_sets_a_tqdm_bar_to_another_processes_progress():
    from tqdm.std import tqdm

    bar = tqdm(total=10, file=io.StringIO(), mininterval=0)
    try:
        assert callable(getattr(bar, "_time", None)), "tqdm._time is gone"
        assert hasattr(bar, "_ema_dt"), "tqdm._ema_dt is gone"
        bar.n = 4
        private.show_elapsed_and_rate(bar, 2.0)
        shown = bar.format_dict
        assert 1.9 < shown["elapsed"] < 3.0, "tqdm.start_t no longer sets the elapsed time"
        assert shown["rate"] is None, "tqdm reads its smoothed rate elsewhere than _ema_dt"
        assert "2.00it/s" in str(bar), "the rate shown is no longer n / elapsed"
    finally:
        bar.close()


def test_a_mirrored_bar_of_a_loop_of_microseconds_closes_on_its_own_line():
    from tqdm.std import tqdm

    out = io.StringIO()
    bar = tqdm(total=5, file=out, mininterval=0, desc="epoch 0")
    made = bar._time()
    while bar._time() == made:  # the engine's loop took less than the time since the bar was made
        pass
    bar.n = 5
    private.show_elapsed_and_rate(bar, 0.0)
    bar.refresh()
    bar.close()
    tqdm(total=5, file=out, mininterval=0, desc="epoch 1").close()
    lines = out.getvalue().split("\n")
    assert "epoch 0: 100%" in lines[0].rsplit("\r", 1)[-1], "the bar's final line was not written"
    assert "epoch 1" in lines[1], lines


def test_ipyparallel_launchers_keep_their_wait_thread():
    launcher = pytest.importorskip("ipyparallel.cluster.launcher")
    for cls in (launcher.LocalProcessLauncher, launcher.SSHLauncher):
        assert "_wait_thread" in dir(cls), f"ipyparallel {cls.__name__}._wait_thread is gone"

    class Launcher:
        _wait_thread = None

    assert private.launcher_has_exited(Launcher()) is False
    done = threading.Thread(target=lambda: None)
    done.start()
    done.join(30)
    Launcher._wait_thread = done
    assert private.launcher_has_exited(Launcher()) is True


def test_ipyparallel_engine_starts_its_nanny_through_the_module_function():
    from ipyparallel.engine import app, nanny

    assert callable(getattr(app, "start_nanny", None)), "ipyparallel.engine.app.start_nanny gone"
    source = inspect.getsource(app.IPEngine.start_nanny)
    assert "return start_nanny(" in source, "IPEngine.start_nanny no longer calls start_nanny"
    assert "nanny_url, self.nanny_pipe = self.start_nanny(" in inspect.getsource(app.IPEngine)
    parameters = inspect.signature(nanny.KernelNanny.__init__).parameters
    assert {"pid", "pipe", "control_url"} <= set(parameters), "KernelNanny's arguments changed"
    assert "kwargs['pipe'] = sys.stdout" in inspect.getsource(nanny.main), "nanny's pipe moved"
    saved = app.start_nanny
    try:
        private.replace_nanny_starter(app, len)
        assert app.start_nanny is len
    finally:
        app.start_nanny = saved


def test_ipyparallel_client_keeps_its_connection_config():
    client = pytest.importorskip("ipyparallel.client.client")
    source = inspect.getsource(client.Client.__init__)
    assert "self._config = cfg" in source, "ipyparallel Client no longer keeps _config"
    assert "location" in inspect.getsource(client.Client), "Client._config has no location"

    class Client:
        def __init__(self):
            self._config = {"location": "10.0.0.5"}

    assert private.client_location(Client()) == "10.0.0.5"
    assert private.client_location(None) is None


def test_ipyparallel_client_can_ask_its_hub_for_engines_in_its_io_thread():
    client = pytest.importorskip("ipyparallel.client.client")
    parameters = inspect.signature(client.Client._send).parameters
    assert list(parameters)[1:3] == ["socket", "msg_type"], "Client._send's arguments changed"
    streams = inspect.getsource(client.Client._setup_streams)
    assert "self._query_stream = ZMQStream(" in streams, "Client._query_stream is gone"
    assert "self._io_loop" in streams, "Client._io_loop is gone"
    update = inspect.getsource(client.Client._update_engines)
    assert "self._ids" in update and "int(k)" in update, "Client._update_engines changed"
    hub = pytest.importorskip("ipyparallel.controller.hub")
    reply = inspect.getsource(hub.Hub.connection_request)
    assert "content['engines']" in reply, "the hub's connection_reply has no engines"
    # tests/cluster/test_registration_not_heard.py uses it against a real controller


def test_ipyparallel_engine_keeps_its_sigterm_handler():
    app = pytest.importorskip("ipyparallel.engine.app")
    assert "_signal_stop" in dir(app.IPEngine), "ipyparallel IPEngine._signal_stop is gone"
    engine = private.stop_noting_engine(app.IPEngine)
    assert issubclass(engine, app.IPEngine) and engine.stopping is False


def test_controller_connection_files_are_written_whole(tmp_path):
    import inspect
    import json
    import logging
    import types

    from ipyparallel.controller.app import IPController

    from nbdist.cluster.launch._controller_main import _save_connection_dict_atomically

    original = inspect.signature(IPController.save_connection_dict)
    assert list(original.parameters) == ["self", "fname", "cdict"], (
        "ipyparallel IPController.save_connection_dict changed its signature"
    )
    app = types.SimpleNamespace(  # the two attributes of IPController the method reads
        profile_dir=types.SimpleNamespace(security_dir=str(tmp_path)),
        log=logging.getLogger("test"),
    )
    _save_connection_dict_atomically(app, "ipcontroller-engine.json", {"key": "k", "n": 1})
    written = tmp_path / "ipcontroller-engine.json"
    assert json.loads(written.read_text()) == {"key": "k", "n": 1}
    assert written.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["ipcontroller-engine.json"]  # no temp left


def test_heart_monitor_keeps_what_the_fast_start_beat_wraps():
    import inspect

    from ipyparallel.controller.heartmonitor import HeartMonitor

    assert list(inspect.signature(HeartMonitor.beat).parameters) == ["self"]
    assert list(inspect.signature(HeartMonitor.start).parameters) == ["self"]
    assert "self.caller = ioloop.PeriodicCallback(self.beat, self.period)" in inspect.getsource(
        HeartMonitor.start
    ), "ipyparallel HeartMonitor.start no longer keeps its PeriodicCallback as .caller"
    traits = HeartMonitor.class_trait_names()
    assert {"hearts", "on_probation", "period"} <= set(traits)


def test_dynamo_frame_hook_is_none_in_eager_code_and_set_inside_a_compiled_function():
    assert private.dynamo_frame_hook() is None, (
        "torch._C._dynamo.eval_frame.get_eval_frame_callback no longer returns None in eager "
        "code (nbdist's collectives use it to skip torch.compiler.disable's wrapper)"
    )
    hooks = []
    disabled = torch.compiler.disable(lambda: None, reason="probe")

    def probe() -> None:  # marked like nbdist's collectives: called, not traced
        hooks.append(private.dynamo_frame_hook())
        disabled()

    private.skipped_by_dynamo_like(probe, disabled)

    def step(x: torch.Tensor) -> torch.Tensor:
        probe()
        return x * 2

    assert torch.equal(torch.compile(step, backend="eager")(torch.ones(1)), torch.full((1,), 2.0))
    assert hooks and hooks[0] is not None, (
        "torch._C._dynamo.eval_frame.get_eval_frame_callback returned None inside a compiled "
        "function: nbdist's collectives would then skip torch.compiler.disable there"
    )


def test_skipped_by_dynamo_like_makes_a_graph_break_with_the_disabled_reason():
    def impl(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    disabled = torch.compiler.disable(impl, reason="nbdist probe reason")

    def wrapper(x: torch.Tensor) -> torch.Tensor:
        return disabled(x)

    private.skipped_by_dynamo_like(wrapper, disabled)

    def step(x: torch.Tensor) -> torch.Tensor:
        return wrapper(x * 2)

    with pytest.raises(Exception, match="nbdist probe reason"):
        torch.compile(step, backend="eager", fullgraph=True)(torch.ones(1))
    assert torch.equal(
        torch.compile(step, backend="eager")(torch.ones(1)), torch.full((1,), 3.0)
    ), (
        "a wrapper marked with torch._dynamo.eval_frame.skip_code and the _torchdynamo_disable* "
        "attributes no longer runs as a graph break"
    )
