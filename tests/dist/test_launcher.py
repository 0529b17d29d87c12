"""nbdist.testing: real worker processes, their environments and results, and their cleanup."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from nbdist.testing import (
    RESULT_ENV,
    assert_all_ok,
    free_port,
    free_ports,
    no_leftover_processes,
    report,
    run_workers,
    tf_config_env,
    torchrun_env,
    worker_env,
)

pytestmark = pytest.mark.dist


@pytest.fixture(autouse=True)
def _no_leftovers():
    with no_leftover_processes():
        yield


def _gone(pid: int, within: float = 5.0) -> bool:
    """Whether `pid` is gone (or a zombie, dead and awaiting its new parent) within `within` s."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


# --- ports and environments ------------------------------------------------------------------


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(4)
    assert len(set(ports)) == 4
    assert all(0 < port < 65536 for port in ports)
    assert 0 < free_port() < 65536
    with pytest.raises(ValueError, match="at least 1"):
        free_ports(0)


def test_torchrun_env_has_torchruns_variables():
    env = torchrun_env(1, 2, 29511)
    assert env == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29511",
    }
    env = torchrun_env(3, 4, 29511, local_rank=1, local_world_size=2)
    assert (env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("3", "1", "2")
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\)"):
        torchrun_env(2, 2, 29511)
    with pytest.raises(ValueError, match="free_port"):
        torchrun_env(0, 2, 0)


def test_tf_config_env_is_valid_json_with_each_workers_index():
    ports = free_ports(3)
    envs = [tf_config_env(rank, 3, ports) for rank in range(3)]
    code = "import json, os; report(json.loads(os.environ['TF_CONFIG']))"
    results = run_workers(code, envs, timeout=15)
    assert_all_ok(results)
    workers = [f"127.0.0.1:{port}" for port in ports]
    for rank, result in enumerate(results):
        assert json.loads(envs[rank]["TF_CONFIG"]) == result.result
        assert result.result == {
            "cluster": {"worker": workers},
            "task": {"type": "worker", "index": rank},
        }
    with pytest.raises(ValueError, match=r"one port per worker.*free_ports\(3\)"):
        tf_config_env(0, 3, ports[:2])


def test_worker_env_drops_a_surrounding_launchers_variables(monkeypatch):
    for name, value in {
        "RANK": "7",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "7",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "1234",
        "TF_CONFIG": "{}",
        "SLURM_JOB_ID": "42",
        "OMP_NUM_THREADS": "16",
    }.items():
        monkeypatch.setenv(name, value)
    env = worker_env({"WORLD_SIZE": "2"})
    assert not {"RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"} & set(env)
    assert not any(name.startswith("SLURM_") for name in env)
    assert env["WORLD_SIZE"] == "2"
    assert (env["OMP_NUM_THREADS"], env["GLOO_SOCKET_IFNAME"], env["PYTHONUNBUFFERED"]) == (
        "1",
        "lo",
        "1",
    )
    with pytest.raises(TypeError, match=r"str\(value\)"):
        worker_env({"RANK": 1})

    code = """
        import os, sys
        names = ["RANK", "MASTER_PORT", "TF_CONFIG", "SLURM_JOB_ID", "OMP_NUM_THREADS"]
        report({"env": {name: os.environ.get(name) for name in names},
                "torch_imported": "torch" in sys.modules})
    """
    (result,) = run_workers(code, [{"RANK": "0"}], timeout=15)
    assert_all_ok([result])
    assert result.result == {
        "env": {
            "RANK": "0",
            "MASTER_PORT": None,
            "TF_CONFIG": None,
            "SLURM_JOB_ID": None,
            "OMP_NUM_THREADS": "1",
        },
        "torch_imported": False,  # the wrapper itself imports neither nbdist nor torch
    }


# --- run_workers -----------------------------------------------------------------------------


def test_two_gloo_ranks_all_reduce_from_env():
    port = free_port()
    code = """
        import torch
        import torch.distributed as dist
        from nbdist.testing import report

        dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR/PORT
        tensor = torch.ones(3)
        dist.all_reduce(tensor)
        report({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": tensor})
        dist.destroy_process_group()
    """
    results = run_workers(code, [torchrun_env(rank, 2, port) for rank in range(2)], timeout=60)
    assert_all_ok(results)
    assert [r.result for r in results] == [
        {"rank": 0, "world": 2, "sum": [2.0, 2.0, 2.0]},
        {"rank": 1, "world": 2, "sum": [2.0, 2.0, 2.0]},
    ]
    assert all(r.reported and not r.timed_out for r in results)


def test_a_raising_worker_fails_with_its_traceback_in_the_message():
    code = """
        import os
        if os.environ["RANK"] == "1":
            raise ValueError("boom on rank 1")
        report("fine")
    """
    results = run_workers(code, [{"RANK": "0"}, {"RANK": "1"}], timeout=15)
    assert results[0].ok and results[0].result == "fine"
    assert results[1].returncode != 0 and not results[1].timed_out
    assert not results[1].reported
    with pytest.raises(AssertionError) as info:
        assert_all_ok(results)
    message = str(info.value)
    assert message.startswith("1 of 2 workers failed.")
    assert "worker 1 " in message and "returncode 1" in message
    assert "Traceback (most recent call last)" in message
    assert 'raise ValueError("boom on rank 1")' in message  # the source line, from the file
    assert "ValueError: boom on rank 1" in message
    assert "worker 0 " not in message


def test_a_hanging_worker_times_out_and_is_killed_with_its_children():
    code = """
        import subprocess, sys, threading
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        report({"child": child.pid})
        threading.Event().wait()
    """
    start = time.monotonic()
    (result,) = run_workers(code, [{}], timeout=3)
    took = time.monotonic() - start
    assert result.timed_out and not result.ok
    assert result.returncode == -signal.SIGTERM
    assert 3 <= result.elapsed < 3 + 2.5 and took < 3 + 3
    assert result.result == {"child": result.result["child"]}  # reported before it hung
    assert not psutil.pid_exists(result.pid)  # reaped
    assert _gone(result.result["child"])  # the whole process group was killed
    assert "threading.py" in result.stderr  # faulthandler's stack dump on SIGTERM
    with pytest.raises(AssertionError, match=r"worker 0 .*timed out.*\n(.*\n)*.*raise timeout="):
        assert_all_ok([result])


def test_a_worker_that_exits_hard_has_its_returncode():
    (result,) = run_workers("import os; os._exit(3)", [{}], timeout=15)
    assert result.returncode == 3
    assert not result.timed_out and not result.reported and result.result is None
    with pytest.raises(AssertionError, match="returncode 3"):
        assert_all_ok([result])


def test_fail_fast_kills_the_peers_of_a_failed_worker():
    code = """
        import os, threading
        if os.environ["RANK"] == "0":
            os._exit(3)
        threading.Event().wait()
    """
    start = time.monotonic()
    results = run_workers(code, [{"RANK": "0"}, {"RANK": "1"}], timeout=15, fail_fast=True)
    assert time.monotonic() - start < 8
    assert results[0].returncode == 3
    assert results[1].returncode < 0 and not results[1].timed_out


def test_ctrl_c_in_the_launcher_kills_and_reaps_every_worker(tmp_path):
    worker_code = """
        import os, pathlib, threading
        (pathlib.Path(os.environ["PID_DIR"]) / str(os.getpid())).touch()
        threading.Event().wait()
    """
    launcher_code = (
        "from nbdist.testing import run_workers\n"
        f"run_workers({worker_code!r}, [{{}}, {{}}], timeout=60)\n"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", launcher_code],
        env={**worker_env({}), "PID_DIR": str(tmp_path)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 45  # two Pythons importing torch on a loaded machine
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int(path.name) for path in tmp_path.iterdir()]
        assert len(pids) == 2, "the workers did not start within 45 s"
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=10)
    finally:
        launcher.kill()
        launcher.wait()
    assert "KeyboardInterrupt" in stderr
    # Not even zombies: the launcher reaped them before it exited.
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_run_workers_rejects_bad_arguments():
    with pytest.raises(ValueError, match="one environment mapping per worker"):
        run_workers("pass", [])
    with pytest.raises(ValueError, match="one environment mapping per worker"):
        run_workers("pass", {"RANK": "0"})
    with pytest.raises(ValueError, match="positive"):
        run_workers("pass", [{}], timeout=0)


# --- report and no_leftover_processes ---------------------------------------------------------


def test_report_writes_json_with_tensors_as_lists(tmp_path, monkeypatch):
    path = tmp_path / "result.json"
    monkeypatch.setenv(RESULT_ENV, str(path))
    report({"t": torch.arange(3.0), "n": torch.tensor(2), "pair": (1, "a")})
    assert json.loads(path.read_text()) == {"t": [0.0, 1.0, 2.0], "n": 2, "pair": [1, "a"]}
    report("replaced")
    assert json.loads(path.read_text()) == "replaced"
    with pytest.raises(TypeError, match="Convert the value first"):
        report(object())
    monkeypatch.delenv(RESULT_ENV)
    with pytest.raises(RuntimeError, match="run_workers"):
        report(1)


def test_no_leftover_processes_names_a_child_left_running():
    children = []
    try:
        with pytest.raises(AssertionError, match=r"1 child process.*\n.*time.sleep\(600\)"):
            # Fails only after the grace period, so ask for a short one.
            with no_leftover_processes(grace=0.3):
                sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
                children.append(subprocess.Popen(sleeper))
    finally:
        for child in children:
            child.kill()
            child.wait()
