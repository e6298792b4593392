"""A one-node Slurm cluster started for the tests (Debian's slurm-wlm and munge, as
../shared/slurm/ describes): munged, slurmctld and slurmd in a temporary folder, with their own
socket, ports, state and logs, stopped by PID at the end. The node declares 8 CPUs whatever the
machine has (``config_overrides``), so that the tests' jobs, which mostly wait, run at once.
Skipped, with the reason, where it cannot start (not root, Slurm not installed, a daemon that
does not come up).

``proctrack``: ``linuxproc`` or ``cgroup`` (which needs cgroup v1's freezer; without it that
cluster is a skip reason)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

from dg_plugins.sweep.processes import _load_libc, die_with_parent

_load_libc()  # before any fork

DAEMONS = ("munged", "slurmctld", "slurmd")
PROCTRACKS = ("linuxproc", "cgroup")
CONF = """ClusterName=dgtest
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/{proctrack}
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=30
MinJobAge=300
SlurmdParameters=config_overrides
NodeName=localhost CPUs=8 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=short Nodes=localhost MaxTime=2 State=UP
"""
CGROUP_CONF = """CgroupPlugin=cgroup/v1
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
"""


def _end_with_the_tests() -> None:
    """A daemon's ``preexec_fn``: SIGTERM when the test process that started it dies, so that
    a killed test run leaves no cluster behind."""
    die_with_parent(signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def why_no_cluster(proctrack: str) -> str | None:
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (slurmd runs as root)"
    missing = [d for d in DAEMONS if shutil.which(d, path="/usr/sbin:/usr/bin:/sbin") is None]
    missing += [c for c in ("sbatch", "squeue", "scontrol") if shutil.which(c) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): apt-get install "
                "slurm-wlm munge (.ci/run does, as root)")
    if proctrack == "cgroup" and not os.path.isdir("/sys/fs/cgroup/freezer"):
        return "proctrack/cgroup needs cgroup v1's freezer (/sys/fs/cgroup/freezer is absent)"
    return None


class Cluster:
    """The running cluster: ``env`` for its clients (SLURM_CONF), and a few commands."""

    def __init__(self, root, proctrack: str):
        self.root = str(root)
        self.proctrack = proctrack
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, SLURM_CONF=os.path.join(self.root, "slurm.conf"))

    def start(self) -> None:
        root = self.root
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        os.chmod(root, 0o755)
        key = os.path.join(root, "munge", "key")
        with open(key, "wb") as handle:
            handle.write(os.urandom(128))
        os.chmod(key, 0o600)
        conf = CONF.format(root=root, ctld_port=free_port(), d_port=free_port(),
                           proctrack=self.proctrack)
        with open(os.path.join(root, "slurm.conf"), "w") as handle:
            handle.write(conf)
        with open(os.path.join(root, "cgroup.conf"), "w") as handle:
            handle.write(CGROUP_CONF)
        logs = open(os.path.join(root, "log", "daemons.out"), "ab")
        self._spawn(["munged", "-f", "-F", f"--socket={root}/munge/socket", f"--key-file={key}",
                     f"--pid-file={root}/munge/pid", f"--seed-file={root}/munge/seed",
                     f"--log-file={root}/log/munged.log"], logs)
        self._wait_for(lambda: os.path.exists(f"{root}/munge/socket"), "munged")
        conf_path = self.env["SLURM_CONF"]
        self._spawn(["slurmctld", "-D", "-f", conf_path], logs)
        self._wait_for(lambda: "UP" in self.client("scontrol", "ping", check=False), "slurmctld")
        self._spawn(["slurmd", "-D", "-f", conf_path, "-N", "localhost"], logs)
        self._wait_for(lambda: self.client("sinfo", "-h", "-o", "%t", "-p", "debug",
                                           check=False).strip() == "idle", "slurmd")

    def _spawn(self, argv, logs) -> None:
        path = shutil.which(argv[0], path="/usr/sbin:/usr/bin:/sbin")
        self.procs.append(subprocess.Popen([path, *argv[1:]], stdout=logs, stderr=logs,
                                           env=self.env, start_new_session=True,
                                           preexec_fn=_end_with_the_tests))

    def _wait_for(self, ready, name: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"{name} did not come up; logs in {self.root}/log")

    def client(self, *argv, check: bool = True) -> str:
        done = subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                              timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def succeeds(self, *argv) -> bool:
        """Whether the client command exits 0."""
        return subprocess.run(list(argv), capture_output=True, env=self.env,
                              timeout=60).returncode == 0

    def squeue(self) -> dict[str, tuple[str, str]]:
        """``{job id: (state, reason)}`` of every job Slurm holds (array tasks one by one)."""
        out = self.client("squeue", "-h", "-r", "-o", "%i|%T|%r")
        return {line.split("|")[0]: tuple(line.split("|")[1:3]) for line in out.splitlines()}

    def wait_until(self, condition, what: str, timeout: float = 180,
                   start_requeued: bool = False) -> None:
        """Poll ``condition``; with ``start_requeued``, let requeued jobs start meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if start_requeued:
                self.start_now()
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; squeue: "
                             f"{self.squeue()}")

    def start_now(self) -> None:
        """Let requeued jobs start (Slurm holds a requeued job about two minutes, BeginTime)."""
        for job_id, (state, reason) in self.squeue().items():
            if state == "PENDING" and reason == "BeginTime":
                self.client("scontrol", "update", f"JobId={job_id}", "StartTime=now",
                            check=False)

    def stop(self) -> None:
        """Cancel every job, wait for them to end, then stop the daemons."""
        try:
            self.client("scancel", "--user", "root", check=False)
            deadline = time.monotonic() + 40
            while self.squeue() and time.monotonic() < deadline:
                time.sleep(0.5)
        except (RuntimeError, OSError, subprocess.SubprocessError):
            pass  # the controller is not up
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def running(clusters: dict, proctrack: str) -> Cluster:
    """The started cluster of ``proctrack`` (the ``clusters`` fixture's), or a skip naming why
    there is none."""
    import pytest

    cluster = clusters[proctrack]
    if isinstance(cluster, str):
        pytest.skip(f"proctrack/{proctrack}: {cluster}")
    return cluster
