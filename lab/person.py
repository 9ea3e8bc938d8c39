"""A person other than root, for what the lab's tests must see people do.

Slurm records who drained a node (`sacctmgr show event`'s User): the uid of the request, as
munge vouches for it. Root's actions stand for slurmedic's; a test that needs an operator's
(a drain by hand that slurmedic must tell from its own) acts as `ops`: a Linux user on the host
and, with the same uid, in the stack's root (slurmctld runs there and resolves the name), and a
Slurm admin in the accounting database (lab/accounting.py, `add_operator`).
"""

from __future__ import annotations

import pwd
import subprocess

from lab import stacks
from lab.config import LabConfig
from lab.slurm import LabError

PERSON = "ops"
COMMENT = "slurmedic lab operator"
SHELL = "/usr/sbin/nologin"
HOME = "/nonexistent"


def ensure_host_user(name: str = PERSON) -> pwd.struct_passwd:
    """The Linux user `name` on this host, made (with a group of its own) unless it exists."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    proc = subprocess.run(
        ["useradd", "--no-create-home", f"--home-dir={HOME}", f"--shell={SHELL}",
         "--user-group", f"--comment={COMMENT}", name],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    # exit 9: a concurrent lab made it first.
    if proc.returncode not in (0, 9):
        raise LabError(f"useradd {name} failed ({proc.returncode}): {proc.stderr.strip()}")
    return pwd.getpwnam(name)


def ensure(cfg: LabConfig, name: str = PERSON) -> pwd.struct_passwd:
    """The person on the host and in the lab's stack root (same uid and gid)."""
    entry = ensure_host_user(name)
    stack = stacks.get(cfg.stack)
    if not stack.is_host:
        stacks.ensure_user(stack, name, entry.pw_uid, entry.pw_gid)
    return entry


def command(cfg: LabConfig, name: str, *argv: str) -> list[str]:
    """`argv` (a Slurm client command, by name) as run by `name`: its uid and gid, no other
    groups. It keeps one capability, to read files and search directories: the lab's config and
    munge socket live in the run directory, which may be root's and 0700 (pytest's are), where
    a person at a real site reads /etc/slurm and /run/munge. Slurm sees the person (munge
    takes the uid from the socket's peer); nothing it does is a write as root."""
    entry = pwd.getpwnam(name)
    as_person = [
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
    ]
    stack = stacks.get(cfg.stack)
    if stack.is_host:
        return ["setpriv", *as_person, *argv]
    # The wrappers must enter their namespace and chroot as root: the person is taken on only
    # inside, for the command itself.
    where = next(d for d, names in stacks.COMMANDS.items() if argv[0] in names)
    target = f"/usr/{where}/{argv[0]}"
    return [str(cfg.bindir / "stack-exec"), "/usr/bin/setpriv", *as_person, target, *argv[1:]]


def run_as(cfg: LabConfig, name: str, *argv: str, timeout: float = 20.0) -> str:
    """Run a Slurm client command against the lab as `name`; its stdout, or a clear error."""
    proc = subprocess.run(
        command(cfg, name, *argv),
        env=cfg.env(),
        cwd="/",  # the person may not enter the caller's directory; nothing is relative
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise LabError(
            f"{' '.join(argv)} as {name} failed ({proc.returncode}): {proc.stderr.strip()}"
        )
    return proc.stdout
