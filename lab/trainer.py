"""The lab's training-job simulator: one process per node (rank), started by srun.

It behaves like a data-parallel training job where it matters to slurmedic: ranks advance in
lockstep (a file barrier stands in for the all-reduce), so one hung rank stalls them all and the
others die with PyTorch's NCCL watchdog lines after the collective timeout; it checkpoints every
few steps and resumes from the last complete checkpoint when Slurm requeues it; it reports
progress through slurmedic_progress, as a real job would, with a loss that falls with the
steps its weights were trained for (a spoiled checkpoint sends it back); and it logs to
`<run>/joblogs/slurm-<job>-<node>-<rank>.out`, the file mtail tails. Faults come from
`slurmedic lab inject job ...` through a control file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import time

from slurmedic_progress import ProgressReporter

from lab.config import LabConfig
from lab.faults import JobFault, control_path, load_job_control, write_json

BARRIER_POLL_S = 0.05
KEEP_CHECKPOINTS = 1000  # each rank's last checkpoints (a few bytes each), to fall back on


def glog_stamp(level: str = "E") -> str:
    """c10's log prefix: level, MMDD and time with nanoseconds."""
    now = dt.datetime.now()
    return f"{level}{now:%m%d %H:%M:%S}.{now.microsecond * 1000:09d}"


class Rank:
    def __init__(self, args: argparse.Namespace, cfg: LabConfig) -> None:
        env = os.environ
        self.args = args
        self.job = int(env["SLURM_JOB_ID"])
        self.rank = int(env.get("SLURM_PROCID", "0"))
        self.world = int(env.get("SLURM_NTASKS", "1"))
        self.node = env.get("SLURMD_NODENAME", "unknown")
        self.attempt = int(env.get("SLURM_RESTART_COUNT", "0"))
        self.dir = cfg.jobs / str(self.job)
        self.progress_dir = self.dir / "progress" / str(self.attempt)
        self.ckpt_dir = self.dir / "ckpt"
        self.control = control_path(cfg.jobs, self.job)
        self.reporter = ProgressReporter.from_env()
        for d in (self.progress_dir, self.ckpt_dir):
            d.mkdir(parents=True, exist_ok=True)

    def log(self, msg: str) -> None:
        print(f"[rank{self.rank}]:{msg}", flush=True)

    # ---- checkpoints ---------------------------------------------------------------------
    def resume_point(self) -> tuple[int, float | None, int]:
        """The last step every rank checkpointed (a partial checkpoint is unusable), when it was
        written (the earliest of the ranks' shards), and the steps its weights were trained
        for. A spoiled checkpoint (lab/faults.py) loads an older one (`old`), or the step without
        the weights (`corrupt`)."""
        spoiled = load_job_control(self.control).spoiled_for(self.attempt)
        kept: list[list[list[float]]] = []  # per rank: [step, time] of each checkpoint kept
        for r in range(self.world):
            try:
                shard = json.loads((self.ckpt_dir / f"rank{r}.json").read_text())
                kept.append([[float(s), float(t)] for s, t in shard["kept"]])
            except (OSError, ValueError, KeyError, TypeError):
                return 0, None, 0
        complete = sorted(set.intersection(*(set(s for s, _ in k) for k in kept)))
        if spoiled is not None and spoiled.kind == "old":
            complete = [c for c in complete if c < (spoiled.before or 0)]
        if not complete:
            return 0, None, 0
        step = complete[-1]
        written = min(t for k in kept for s, t in k if s == step)
        corrupt = spoiled is not None and spoiled.kind == "corrupt"
        return int(step), written, 0 if corrupt else int(step)

    def save_checkpoint(self, step: int) -> None:
        path = self.ckpt_dir / f"rank{self.rank}.json"
        try:
            kept = json.loads(path.read_text())["kept"][-(KEEP_CHECKPOINTS - 1) :]
        except (OSError, ValueError, KeyError):
            kept = []
        write_json(path, {"kept": [*kept, [step, time.time()]]})
        self.reporter.checkpoint(step)
        self.log(f" saved checkpoint at step {step}")

    def loss(self, trained: int) -> float:
        """The training loss after `trained` steps: falling fast, then flattening, as a real
        run's does; the same on every rank (it is reduced across them)."""
        return 1.0 + 4.0 * math.exp(-trained / 30)

    # ---- the collective --------------------------------------------------------------------
    def peer_step(self, r: int) -> int:
        try:
            return int((self.progress_dir / f"rank{r}").read_text())
        except (OSError, ValueError):
            return -1

    def all_reduce(self, step: int) -> None:
        """Wait until every rank finished `step`; time out the way ProcessGroupNCCL does."""
        (self.progress_dir / f".rank{self.rank}.tmp").write_text(str(step))
        (self.progress_dir / f".rank{self.rank}.tmp").replace(
            self.progress_dir / f"rank{self.rank}"
        )
        start = time.monotonic()
        timeout = self.args.nccl_timeout
        polls = 0
        while any(self.peer_step(r) < step for r in range(self.world)):
            f = self.fault() if polls % 10 == 0 else None
            # A crash meant for this rank surfaces inside the collective too (a CUDA error is
            # reported at whatever call comes next): waiting for a peer that already died of
            # the same fault must not turn this rank's crash into a timeout.
            if f is not None and f.kind.startswith("crash"):
                self.crash(f, step)
            # `timeout_now`: a test says when the watchdog fires, rather than a clock.
            forced = f is not None and f.kind == "timeout_now"
            if forced or time.monotonic() - start > timeout:
                self.nccl_watchdog_abort(step, int((time.monotonic() - start) * 1000))
            polls += 1
            time.sleep(BARRIER_POLL_S)

    def nccl_watchdog_abort(self, seq: int, ran_ms: int) -> None:
        t_ms = int(self.args.nccl_timeout * 1000)
        r = self.rank
        self.log(
            f"[{glog_stamp()} ProcessGroupNCCL.cpp:629] [Rank {r}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=131072000, "
            f"NumelOut=131072000, Timeout(ms)={t_ms}) ran for {ran_ms} milliseconds "
            "before timing out."
        )
        self.log(
            f"[{glog_stamp()} ProcessGroupNCCL.cpp:1664] [Rank {r}] Some NCCL operations have "
            "failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU "
            "operations might run on corrupted/incomplete data."
        )
        self.log(
            f"[{glog_stamp()} ProcessGroupNCCL.cpp:1670] [Rank {r}] To avoid data inconsistency, "
            "we are taking the entire process down."
        )
        sys.exit(6)  # SIGABRT's number: what a torn-down process reports to Slurm

    # ---- faults ------------------------------------------------------------------------------
    def fault(self) -> JobFault | None:
        return load_job_control(self.control).for_rank(self.rank, self.attempt)

    def crash(self, fault: JobFault, step: int) -> None:
        if fault.kind == "crash_nccl":
            self.nccl_watchdog_abort(step, int(self.args.nccl_timeout * 1000) + 81)
        message = {
            "crash_cuda": "CUDA error: an illegal memory access was encountered",
            "crash_ecc": "CUDA error: uncorrectable ECC error encountered",
        }[fault.kind]
        self.log(" Traceback (most recent call last):")
        self.log('   File "/opt/train/pretrain.py", line 214, in <module>')
        self.log("     loss.backward()")
        self.log(f" RuntimeError: {message}")
        self.log(
            " CUDA kernel errors might be asynchronously reported at some other API call, "
            "so the stacktrace below might be incorrect."
        )
        self.log(" For debugging consider passing CUDA_LAUNCH_BLOCKING=1")
        sys.exit(1)

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> int:
        step, written, trained = self.resume_point()
        self.log(
            f" job {self.job} attempt {self.attempt} on {self.node}: world size {self.world}, "
            f"{'resuming from checkpoint at step ' + str(step) if step else 'starting at step 0'}"
        )
        self.reporter.resumed(step, written_at=written)
        self.reporter.step(step, 0.0, quality=self.loss(trained))
        while step < self.args.steps:
            fault = self.fault()
            delay = self.args.step_time
            if fault is not None and fault.kind == "hang":
                # A hung rank says nothing and reports nothing: it is stuck in a kernel.
                time.sleep(1)
                continue
            if fault is not None and fault.kind.startswith("crash"):
                self.crash(fault, step + 1)
            if fault is not None and fault.kind == "slow":
                delay *= fault.factor
            t0 = time.monotonic()
            time.sleep(delay)
            compute = time.monotonic() - t0
            step += 1
            trained += 1
            self.all_reduce(step)
            self.reporter.step(step, compute, quality=self.loss(trained))
            skipping = fault is not None and fault.kind == "skip_checkpoints"
            if step % self.args.ckpt_every == 0 and not skipping:
                self.save_checkpoint(step)
        self.log(f" training finished at step {step}")
        return 0


STARTUP_SECONDS = 1.0  # imports and process-group setup, before the first log line


def redirect_output(cfg: LabConfig) -> None:
    """Send this rank's stdout/stderr to its job-log file (append: requeues continue it)."""
    env = os.environ
    node, rank = env.get("SLURMD_NODENAME", "unknown"), env.get("SLURM_PROCID", "0")
    name = f"slurm-{env['SLURM_JOB_ID']}-{node}-{rank}.out"
    cfg.joblogs.mkdir(parents=True, exist_ok=True)
    fd = os.open(cfg.joblogs / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lab.trainer")
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--step-time", type=float, default=0.5)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--nccl-timeout", type=float, default=15.0)
    args = p.parse_args(argv)
    cfg = LabConfig.from_env()
    redirect_output(cfg)
    # Slurm creates a step's output file before the application starts, and a real training
    # script takes seconds to import and initialise. Keep that order: mtail reads a file it
    # discovers from its end (every 250 ms), so lines written before it looks are never seen.
    time.sleep(STARTUP_SECONDS)
    os.environ.setdefault("SLURMEDIC_PUSHGATEWAY", cfg.pushgateway_url)
    # The lab's steps take 0.5 s and Prometheus scrapes every second: a push every step, as
    # the lab's tests expect, rather than the 15 s a real job would use.
    os.environ.setdefault("SLURMEDIC_PUSH_INTERVAL", "0.1")
    rank = Rank(args, cfg)
    try:
        return rank.run()
    finally:
        # Every way out, a crash's and the NCCL watchdog's sys.exit too: the rank's last step
        # reaches the Pushgateway, as a crashed rank's did when every step was pushed at once.
        rank.reporter.close()


if __name__ == "__main__":
    sys.exit(main())
