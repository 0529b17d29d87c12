"""Slurm specifics of starting engines: what `sbatch` said, a job Slurm will never run, and the
address the engines reach the notebook at.

ipyparallel's Slurm launcher runs `sbatch` with its stderr not captured, so a refused job
would surface as "returned non-zero exit status 1" while Slurm's reason went to the kernel's
log. `SUBMIT_COMMAND` runs `sbatch` with its stderr joined to its stdout, which ipyparallel
keeps in the error (`refusal` turns it into the message), and `JOB_ID_REGEXP` reads the job id
from "Submitted batch job 12" only (not from a warning's numbers); `DELETE_COMMAND` cancels
nothing when no job was submitted (ipyparallel would run `scancel ''`).

A job Slurm accepted may still never start: held, or pending for a reason no waiting fixes
(a per-job limit it exceeds, an invalid account or QOS). `JobWatch` asks `squeue` about the
engines' job about once a second while the engines register, and names such a reason (or a
job that ended before its engines registered) at once rather than when the start times out.

Example:
    >>> import re
    >>> re.search(JOB_ID_REGEXP, "sbatch: warning: x 3\\nSubmitted batch job 42").group(1)
    '42'
    >>> never_runs("JobHeldUser"), never_runs("Resources")
    (True, False)
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from typing import Any

__all__ = [
    "DELETE_COMMAND",
    "JOB_ID_REGEXP",
    "SUBMIT_COMMAND",
    "JobWatch",
    "controller_route",
    "never_runs",
    "refusal",
]

SUBMIT_COMMAND = ["sh", "-c", 'exec sbatch "$@" 2>&1', "sbatch"]
"""`sbatch BATCH_FILE` with Slurm's complaints on stdout (ipyparallel keeps stdout)."""
JOB_ID_REGEXP = r"Submitted batch job (\d+)"
"""The job id in `sbatch`'s answer (group 1)."""
DELETE_COMMAND = ["sh", "-c", '[ -z "$1" ] || exec scancel "$@"', "scancel"]
"""`scancel JOB_ID`, and nothing for a job never submitted (a refused one has no id)."""

_NEVER = re.compile(
    r"PerJob|Invalid|NotAllowed|NeverSatisfied|Held|BadConstraints|PartitionConfig"
    r"|PartitionNodeLimit|PartitionTimeLimit"
)
_LOOK_EVERY_S = 1.0
_SQUEUE_S = 10.0
_FIX = (
    "Check the job's options: `sinfo` lists the partitions and their nodes; pass sbatch "
    "options with launcher_options={'options': '--partition=P --account=A'} (or "
    "`%dist start --launcher-option options='...'`), and ask for no more engines than the "
    "partition has CPUs."
)


def never_runs(reason: str) -> bool:
    """True for a Slurm pending reason that waiting does not clear (held, a limit the job
    exceeds, an invalid account or QOS)."""
    return bool(_NEVER.search(reason))


def refusal(error: BaseException) -> str:
    """The message for `sbatch` refusing the engines' job: what Slurm said, and the fix."""
    said = getattr(error, "output", None) or getattr(error, "stderr", None) or ""
    if isinstance(said, bytes):
        said = said.decode(errors="replace")
    said = str(said).strip() or f"{type(error).__name__}: {error}"
    code = getattr(error, "returncode", None)
    exit_text = f" (sbatch exited with {code})" if code is not None else ""
    return f"Slurm refused the engines' job{exit_text}:\n{said}\n{_FIX}"


class JobWatch:
    """Looks at the engines' Slurm job(s) while they register; `check()` is a message when a
    job will never run its engines, else None. Looks at most once a second.

    Example:
        >>> JobWatch(engine_sets=[]).check() is None
        True
    """

    def __init__(self, engine_sets: Any) -> None:
        self._engine_sets = list(engine_sets)
        self._next = 0.0

    def check(self) -> str | None:
        now = time.monotonic()
        if now < self._next or shutil.which("squeue") is None:
            return None
        self._next = now + _LOOK_EVERY_S
        for engine_set in self._engine_sets:
            job_id = getattr(engine_set, "job_id", None)
            if not job_id:
                continue
            state, reason = _job_state(str(job_id))
            if state is None:
                continue  # squeue did not answer: look again later
            if state == "PENDING" and never_runs(reason):
                return (
                    f"Slurm will not run the engines' job {job_id}: it is pending with reason "
                    f"{reason!r}. It has been cancelled. {_FIX}"
                )
            if state in ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                         "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"):  # fmt: skip
                ended = state.lower() or "left the queue"
                return (
                    f"The engines' Slurm job {job_id} ended ({ended}) before its engines "
                    "registered. The job's output is below."
                )
        return None


def _job_state(job_id: str) -> tuple[str | None, str]:
    """`(state, reason)` of job `job_id` from squeue; `("", "")` when Slurm no longer lists
    it, `(None, "")` when squeue failed."""
    try:
        done = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T|%r"],
            capture_output=True, text=True, timeout=_SQUEUE_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None, ""
    lines = [line for line in done.stdout.splitlines() if "|" in line]
    if done.returncode != 0:
        # a job that ended long ago: "slurm_load_jobs error: Invalid job id specified"
        return ("", "") if "Invalid job id" in done.stderr else (None, "")
    if not lines:
        return "", ""
    state, _, reason = lines[0].partition("|")
    return state.strip(), reason.strip()


def controller_route() -> str | None:
    """The address of this machine on the route to the Slurm controller (`scontrol show
    config`'s SlurmctldHost), the network the compute nodes share with it; None when unknown.
    """
    if shutil.which("scontrol") is None:
        return None
    try:
        done = subprocess.run(
            ["scontrol", "show", "config"],
            capture_output=True, text=True, timeout=_SQUEUE_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", done.stdout, re.M)
    if match is None:
        return None
    from nbdist.cluster.addresses import address_towards

    for target in (match.group(2), match.group(1)):
        if target:
            with contextlib.suppress(OSError, ValueError):
                chosen = address_towards(target)
                if chosen and not chosen.startswith("127."):
                    return chosen
    return None
