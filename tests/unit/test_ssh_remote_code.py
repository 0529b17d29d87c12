"""The Python that nbdist runs on an ssh engine's host to wait for the engine and to read its
output (nbdist/cluster/launch/ssh_launcher.py, Note [Light remote waits]), run here on real
processes and files: it must answer what ipyparallel's own remote code answers."""

from __future__ import annotations

import subprocess
import sys

from nbdist.cluster.launch.ssh_launcher import read_code, wait_code


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return done.stdout


def test_the_wait_says_running_at_its_timeout_and_gone_once_exited():
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)  # fmt: skip
    try:
        assert _run(wait_code(sleeper.pid, 0.2)).split() == ["__process_running=1__"]
        sleeper.stdin.close()  # it exits; unreaped, it is a zombie, which counts as gone
        sleeper.stdin = None
        said = _run(wait_code(sleeper.pid, 30.0)).split()
        assert said == ["__process_running=0__", "__exit_code=-1__"], said
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)
    said = _run(wait_code(sleeper.pid, None)).split()  # reaped: no such process
    assert said == ["__process_running=0__", "__exit_code=-1__"], said


def test_the_read_prints_the_output_and_removes_it_when_asked(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("line one\nline two\n")
    assert _run(read_code(str(log), remove=False)) == "line one\nline two\n"
    assert log.exists()
    assert _run(read_code(str(log), remove=True)) == "line one\nline two\n"
    assert not log.exists()
    assert _run(read_code(str(log), remove=True)) == ""  # gone already: nothing, no error
