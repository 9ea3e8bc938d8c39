"""slurmrestd, Slurm's REST API, in the lab: on its own port, taking JWTs (rest_auth/jwt), as
Slinky's operator and REST-only sites run it (docs/slurmrestd.md).

It refuses to run as root or SlurmUser (26.05 also refuses the development override), so it
runs as a user of its own, on the host and in the stack's root alike (lab/person.py); with
SLURM_JWT=daemon it passes each request's token on to slurmctld and needs no munge key.
"""

from __future__ import annotations

from lab import person, processes
from lab.config import LabConfig
from lab.slurm import LabError, slurm

USER = "slurmrestd"
# A token outlives any lab session; `up` makes a new one.
TOKEN_LIFESPAN_S = 7 * 24 * 3600


def start(cfg: LabConfig) -> None:
    person.ensure(cfg, USER)
    argv = ["slurmrestd", "-f", str(cfg.slurm_conf), "-a", "rest_auth/jwt",
            f"127.0.0.1:{cfg.slurmrestd_port}"]  # fmt: skip
    env = {**cfg.env(), "SLURM_JWT": "daemon"}
    processes.start(cfg, "slurmrestd", person.command(cfg, USER, *argv), env=env, cwd=cfg.run_dir)
    if not processes.wait_until(lambda: processes.port_in_use(cfg.slurmrestd_port), 15, 0.2):
        raise LabError(f"slurmrestd did not listen; see {cfg.logs}/slurmrestd.out")
    # The token a REST-only slurmedic calls it with (SLURMEDIC_LAB_SLURM=rest, and the tests').
    token = slurm(cfg, "scontrol", "token", "username=root", f"lifespan={TOKEN_LIFESPAN_S}")
    cfg.slurmrestd_token_file.write_text(token)
    cfg.slurmrestd_token_file.chmod(0o600)
