"""A sweep's arms as one SLURM job array, through submitit (`lm sweep --launcher=slurm`).

Each arm is one element of the array: one process on one node that runs the arm's `lm train` command in
its folder (the command a local sweep runs), with the resources of the --slurm_* flags. Its log goes to
<arm>/train.log; submitit's own logs and pickles to the --slurm_folder.

Preemption and time limits: SLURM sends SIGUSR2 SIGNAL_DELAY_S seconds before an element's time limit;
submitit calls ArmJob.checkpoint, which stops `lm train` with SIGTERM (it saves a checkpoint and exits) and
requeues the element, whose rerun of the same command resumes from that checkpoint (MAX_TIMEOUTS times at
most). A preempted element gets SIGTERM from SLURM: `lm train` saves a checkpoint and stops, and SLURM
requeues it (the jobs are submitted with --requeue). `lm train` ignores SIGUSR2, so that the signal meant
for submitit does not end it.

This module needs submitit (pip install -e ".[slurm]"); lm.cli.sweep imports it only for --launcher=slurm.
"""

import contextlib
import io
import os
import signal
import subprocess
import threading

import submitit
from submitit.core.utils import DelayedSubmission, FailedJobError

from lm.errors import UserError

SIGNAL_DELAY_S = 120  # seconds between SLURM's SIGUSR2 and the time limit: the arm saves its checkpoint in them
MAX_TIMEOUTS = 100  # how many times an element is requeued at its time limit (each one resumes the arm)


def ignore_usr2() -> None:
    """In the `lm train` process before it starts: SIGUSR2 (submitit's signal) is ignored, not fatal."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class ArmJob(submitit.helpers.Checkpointable):
    """One arm's element of the job array: runs its `lm train` command (in cwd, output appended to log) and
    returns 0; a failed or stopped run is a RuntimeError (the element's state FAILED). Requeued by
    checkpoint (see the module docstring)."""

    def __init__(self, command: list[str], cwd: str, log: str):
        self.command, self.cwd, self.log = command, cwd, log
        self._process: subprocess.Popen | None = None
        self._ended: threading.Event | None = None

    def __call__(self) -> int:
        os.makedirs(os.path.dirname(self.log), exist_ok=True)
        with open(self.log, "a") as log:
            log.write(f"$ {' '.join(self.command)}\n")
            log.flush()
            self._process = subprocess.Popen(self.command, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                             preexec_fn=ignore_usr2)
        # The main thread waits on an Event, not on the process: submitit's signal handler (checkpoint) runs
        # in the main thread and must see the process end while this wait is interrupted.
        self._ended = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()
        self._ended.wait()
        code = self._process.returncode
        if code:
            raise RuntimeError(f"lm train exited with code {code} (see {self.log}); rerun the sweep to resume it")
        return code

    def _wait(self) -> None:
        self._process.wait()
        self._ended.set()

    def checkpoint(self) -> DelayedSubmission:
        """At SIGUSR2: stops the running `lm train` (SIGTERM: it saves a checkpoint), waits for it to exit,
        and resubmits the same command, which resumes from that checkpoint."""
        if self._process is not None and self._ended is not None and not self._ended.is_set():
            self._process.send_signal(signal.SIGTERM)
            self._ended.wait(SIGNAL_DELAY_S - 15)
        return DelayedSubmission(ArmJob(self.command, self.cwd, self.log))


def submit(commands: list[tuple[list[str], str]], folder: str, cluster: str = "slurm", time_min: int = 240,
           gpus_per_node: int | None = None, cpus_per_task: int | None = None, mem_gb: float | None = None,
           partition: str | None = None, account: str | None = None, qos: str | None = None,
           array_parallelism: int | None = None) -> list[str]:
    """Submits one job array of ArmJobs, one per (lm train command, log file) of commands, run in the current
    folder, with these resources; returns the job ids, in order. cluster "local" runs them as local processes
    (submitit's LocalExecutor: the same jobs, for tests). sbatch refusing the array is a UserError."""
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster, slurm_max_num_timeout=MAX_TIMEOUTS,
                                     local_max_num_timeout=MAX_TIMEOUTS)
    executor.update_parameters(
        name="lm-sweep", timeout_min=time_min, nodes=1, tasks_per_node=1, gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task, mem_gb=mem_gb, slurm_partition=partition, slurm_account=account,
        slurm_qos=qos, slurm_array_parallelism=array_parallelism, slurm_signal_delay_s=SIGNAL_DELAY_S,
        slurm_additional_parameters={"requeue": True})
    cwd = os.getcwd()
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's error too
            jobs = executor.submit_array([ArmJob(command, cwd, log) for command, log in commands])
    except FailedJobError as e:
        raise UserError(f"sbatch refused the arms' job array ({' '.join(str(e).split())}); its script is in "
                        f"{folder}") from e
    return [job.job_id for job in jobs]


def job_states(job_ids: list[str]) -> dict[str, str]:
    """{job id: SLURM state} (PENDING, RUNNING, COMPLETED, FAILED, ...; UNKNOWN where sacct does not know it),
    from one sacct call through submitit's watcher."""
    watcher = submitit.SlurmJob.watcher
    for job_id in job_ids:
        watcher.register_job(job_id)
    watcher.update()
    return {job_id: watcher.get_state(job_id, mode="cache") for job_id in job_ids}


def is_active(state: str) -> bool:
    """Whether a job in this SLURM state may still run (submitit's notion: pending, running, requeued,
    preempted, or unknown to sacct)."""
    return state.split()[0].upper() in ("READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING",
                                        "PREEMPTED", "CONFIGURING", "SUSPENDED", "REQUEUE_HOLD", "RESIZING")
