"""Slurm accounting for the lab: MariaDB and slurmdbd, as a real site runs them.

MariaDB is the host's Debian server (scripts/setup.sh installs it) for every stack: it is the
site's database, not what is under test. One server per lab, its data under the run directory,
run in the foreground by PID on 127.0.0.1 at the lab's port, as root (`--user=root`): so its
state lives and is purged with the run directory, which may be root's and 0700 (pytest's are),
where a `mysql` user could not enter (lab/postgres.py keeps its cluster outside instead, and
has to clean it up on its own).

slurmdbd is the stack's own (its release must be slurmctld's or newer, so it comes from the same
root), configured beside slurm.conf (it reads `slurmdbd.conf` from SLURM_CONF's directory). It
starts before slurmctld, with the cluster registered, so slurmctld's first records reach it.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path

from lab import processes
from lab.config import LabConfig
from lab.slurm import CLUSTER, LabError, slurm

DATABASE = "slurm_acct_db"
DB_USER = "slurm"
MARIADB_BIN = Path("/usr/sbin/mariadbd")
# An account for the lab's people (lab/person.py), apart from root's.
PEOPLE_ACCOUNT = "operators"


# ---- MariaDB ---------------------------------------------------------------------------------


def mariadb_dir(cfg: LabConfig) -> Path:
    return cfg.run_dir / "mariadb"


def mariadb_socket(cfg: LabConfig) -> Path:
    return mariadb_dir(cfg) / "mariadb.sock"


def password_file(cfg: LabConfig) -> Path:
    """slurmdbd's database password (0600): made once, kept for the next `lab up`."""
    return mariadb_dir(cfg) / "slurm.password"


def init_mariadb(cfg: LabConfig) -> None:
    """A new data directory unless one is there (`mariadb-install-db`, ~1 s)."""
    data = mariadb_dir(cfg) / "data"
    if (data / "mysql").is_dir():
        return
    if not MARIADB_BIN.exists() or shutil.which("mariadb-install-db") is None:
        raise LabError("MariaDB is not installed: run ./scripts/setup.sh first")
    if data.exists():
        shutil.rmtree(data)  # an initialisation cut short
    data.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # --no-defaults: none of the host's /etc/mysql (its socket, its data dir); root may connect
    # on the socket as the Unix user root, nobody else but slurmdbd's user at all. A temporary
    # directory of its own: two labs initialising at once in the shared /tmp failed on each
    # other's temporary tables ("Could not remove temporary table '/tmp/#sql-temptable-...'").
    proc = subprocess.run(
        ["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={data}",
         f"--tmpdir={mariadb_tmp(cfg)}", "--auth-root-authentication-method=socket",
         "--skip-test-db"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        shutil.rmtree(data, ignore_errors=True)
        raise LabError(f"mariadb-install-db failed ({proc.returncode}): {proc.stderr.strip()}")


def mariadb_tmp(cfg: LabConfig) -> Path:
    """The lab's MariaDB's own temporary directory (never the shared /tmp)."""
    return mariadb_dir(cfg) / "tmp"


def mariadb_argv(cfg: LabConfig) -> list[str]:
    """The server in the foreground, loopback only, with the settings slurmdbd asks for: it
    logs an error below half of 1 GiB of buffer pool, 64 MiB of log file or 900 s of lock wait
    (22.05 is content with these; 24.11 and later still name the pool, harmlessly for a lab's
    few rows). The pool's memory is taken only as it is used."""
    d = mariadb_dir(cfg)
    return [
        str(MARIADB_BIN),
        "--no-defaults",
        "--user=root",
        f"--datadir={d / 'data'}",
        f"--tmpdir={mariadb_tmp(cfg)}",
        f"--socket={mariadb_socket(cfg)}",
        f"--pid-file={d / 'mariadb.pid'}",
        f"--log-error={cfg.logs / 'mariadb.log'}",
        "--bind-address=127.0.0.1",
        f"--port={cfg.mariadb_port}",
        "--skip-name-resolve",
        "--innodb-buffer-pool-size=1G",
        "--innodb-log-file-size=64M",
        "--innodb-lock-wait-timeout=900",
    ]


def sql(cfg: LabConfig, statements: str) -> str:
    """Run SQL as MariaDB's root (on the socket); its output, tab-separated."""
    proc = subprocess.run(
        ["mariadb", "--no-defaults", f"--socket={mariadb_socket(cfg)}", "--user=root",
         "--batch", "--skip-column-names", "-e", statements],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise LabError(f"MariaDB: {statements!r} failed: {proc.stderr.strip()}")
    return proc.stdout


def password(cfg: LabConfig) -> str:
    path = password_file(cfg)
    if not path.exists():
        path.write_text(secrets.token_hex(16) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def start_mariadb(cfg: LabConfig) -> None:
    """MariaDB, started unless it runs, with slurmdbd's database and user once it answers."""
    # Before the data dir is made, and also for one made before the lab had it.
    mariadb_dir(cfg).mkdir(mode=0o700, parents=True, exist_ok=True)
    mariadb_tmp(cfg).mkdir(mode=0o700, exist_ok=True)
    init_mariadb(cfg)
    processes.start(cfg, "mariadb", mariadb_argv(cfg))
    if not processes.wait_until(lambda: sql(cfg, "SELECT 1").strip() == "1", 60, 0.2):
        raise LabError(
            f"MariaDB does not answer on {mariadb_socket(cfg)}; see {cfg.logs}/mariadb.log"
        )
    # slurmdbd connects over TCP to 127.0.0.1 (StorageHost): its user is for that host only.
    pw = password(cfg)
    sql(
        cfg,
        f"CREATE DATABASE IF NOT EXISTS {DATABASE}; "
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
        f"GRANT ALL ON {DATABASE}.* TO '{DB_USER}'@'127.0.0.1';",
    )


# ---- slurmdbd --------------------------------------------------------------------------------


def slurmdbd_conf(cfg: LabConfig) -> Path:
    """Beside slurm.conf: slurmdbd reads it from SLURM_CONF's directory."""
    return cfg.etc / "slurmdbd.conf"


def render_slurmdbd_conf(cfg: LabConfig, db_password: str) -> str:
    return "\n".join(
        [
            "# Written by `slurmedic lab up`; edits are overwritten.",
            "AuthType=auth/munge",
            f"AuthInfo=socket={cfg.munge_socket}",
            f"DbdHost={cfg.hostname}",
            "DbdAddr=127.0.0.1",
            f"DbdPort={cfg.slurmdbd_port}",
            "SlurmUser=root",
            "DebugLevel=info",
            f"LogFile={cfg.logs}/slurmdbd.log",
            f"PidFile={cfg.run_dir}/slurm/slurmdbd.pid",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={cfg.mariadb_port}",
            f"StorageUser={DB_USER}",
            f"StoragePass={db_password}",
            f"StorageLoc={DATABASE}",
            "",
        ]
    )


def write_slurmdbd_conf(cfg: LabConfig) -> None:
    """slurmdbd refuses a config others may read (it holds the database password)."""
    path = slurmdbd_conf(cfg)
    text = render_slurmdbd_conf(cfg, password(cfg))
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    path.chmod(0o600)


def answers(cfg: LabConfig) -> bool:
    """slurmdbd answers a client (sacctmgr talks to it, not to slurmctld)."""
    slurm(cfg, "sacctmgr", "-n", "-P", "show", "cluster", "format=Cluster")
    return True


def start_slurmdbd(cfg: LabConfig) -> None:
    write_slurmdbd_conf(cfg)
    (cfg.run_dir / "slurm").mkdir(parents=True, exist_ok=True)
    processes.start(cfg, "slurmdbd", ["slurmdbd", "-D"])
    # The first start creates the database's tables (a few seconds).
    if not processes.wait_until(lambda: answers(cfg), 90, 0.3):
        raise LabError(f"slurmdbd does not answer; see {cfg.logs}/slurmdbd.log")


def register_cluster(cfg: LabConfig) -> None:
    """The cluster in the database before slurmctld registers with it.

    A new database gives the cluster a new id; slurmctld's state from an earlier lab in this
    run directory (one without accounting, which made up an id of its own) holds another, and
    slurmctld refuses to start ("CLUSTER ID MISMATCH", a guard for clusters sharing a state
    directory, which a lab's never does). Its `clustername` file goes, as the message says."""
    clusters = slurm(cfg, "sacctmgr", "-n", "-P", "show", "cluster", "format=Cluster").split()
    if CLUSTER not in clusters:
        slurm(cfg, "sacctmgr", "-i", "add", "cluster", CLUSTER)
        (cfg.run_dir / "slurm" / "state" / "clustername").unlink(missing_ok=True)


def start(cfg: LabConfig) -> None:
    """MariaDB and slurmdbd, with the cluster registered (before slurmctld starts)."""
    start_mariadb(cfg)
    start_slurmdbd(cfg)
    register_cluster(cfg)


def add_operator(cfg: LabConfig, user: str) -> None:
    """`user` (a Linux user on the host and in the stack) as the cluster's operator: an account
    of the lab's people, an association on the cluster, and AdminLevel=Admin. Slurm's
    `Operator` level is the database's (users, accounts, reservations): slurmctld refuses a node
    update from it ("Security violation, UPDATE_NODE RPC from uid=..."); `Admin` may drain and
    resume, as a site's operators do."""
    level = slurm(cfg, "sacctmgr", "-n", "-P", "show", "user", user, "format=AdminLevel").strip()
    if level == "Administrator":
        return
    accounts = slurm(cfg, "sacctmgr", "-n", "-P", "show", "account", "format=Account").split()
    if PEOPLE_ACCOUNT not in accounts:
        slurm(cfg, "sacctmgr", "-i", "add", "account", PEOPLE_ACCOUNT, f"Cluster={CLUSTER}",
              "Description=the lab's people", f"Organization={CLUSTER}")  # fmt: skip
    if not level:
        slurm(cfg, "sacctmgr", "-i", "add", "user", user, f"Account={PEOPLE_ACCOUNT}",
              f"Cluster={CLUSTER}", "AdminLevel=Admin")  # fmt: skip
    else:
        slurm(cfg, "sacctmgr", "-i", "modify", "user", user, "set", "AdminLevel=Admin")


def stop(cfg: LabConfig) -> None:
    """slurmdbd, then MariaDB (after slurmctld: it sends slurmdbd what it holds on the way)."""
    processes.stop(cfg, "slurmdbd")
    # InnoDB's clean shutdown may take a few seconds; a killed server recovers, but slowly.
    processes.stop(cfg, "mariadb", grace=30.0)
