"""The software stacks the lab runs: the host's Debian packages, or another Debian release's.

A stack other than the host's is a root filesystem built with `debootstrap --variant=minbase`
from the Debian archive apt already uses here, once, and cached outside the repo
(`/var/cache/slurmedic/stacks/NAME-HASH`, or `SLURMEDIC_STACK_CACHE`). Its daemons and clients run
inside it through `bin/` wrappers in the lab's run directory: each wrapper enters a mount
namespace of its own (so nothing stays mounted when the process ends, and two labs never share
a mount), bind-mounts /proc, /sys, /dev, /etc/hosts, the repo, the Python slurmedic runs on and
the run directory at their own paths, and `chroot`s. Job tasks that slurmd starts are inside
it too, so the training simulator runs on the host's Python there.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import slurmedic_progress

from lab.config import CODE_ROOT
from webhook import resources

STACK_ENV = "SLURMEDIC_LAB_STACK"
IN_STACK_ENV = "SLURMEDIC_IN_STACK"  # set inside a stack's root (EXEC_SCRIPT): its name
CACHE_ENV = "SLURMEDIC_STACK_CACHE"
MIRROR_ENV = "SLURMEDIC_DEBIAN_MIRROR"
DEFAULT_CACHE = Path("/var/cache/slurmedic/stacks")

# What the lab runs from a stack: Slurm (slurmdbd too: its release must be slurmctld's), munge
# and the monitoring stack. The libraries are those the host's Python loads for the simulator's
# imports (ssl, ctypes, sqlite3, ...): the simulator runs inside the root, on the host's
# interpreter.
PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "slurm-client",
    "slurmrestd",
    "slurm-wlm-jwt-plugin",
    "munge",
    "prometheus",
    "prometheus-alertmanager",
    "prometheus-pushgateway",
    "mtail",
    "libssl3t64",
    "libffi8",
    "libsqlite3-0",
    "libbz2-1.0",
    "liblzma5",
    "zlib1g",
)

# Commands of a stack that the lab, slurmedic, the playbooks and the tests call by name.
COMMANDS = {
    "sbin": ("slurmctld", "slurmd", "slurmdbd", "slurmrestd", "munged", "mungekey"),
    "bin": (
        "sinfo",
        "squeue",
        "scontrol",
        "sbatch",
        "srun",
        "scancel",
        "sacct",
        "sacctmgr",
        "prometheus",
        "promtool",
        "prometheus-alertmanager",
        "amtool",
        "prometheus-pushgateway",
        "mtail",
    ),
}

# The versions each stack is known to carry (Debian's packages when the stack was added):
# `lab stacks` shows the versions a built root really has.
VERSIONS_COMPONENTS = ("slurmctld", "prometheus", "prometheus-alertmanager", "mtail")


@dataclass(frozen=True)
class Stack:
    name: str
    suite: str | None  # None: the host's own packages
    description: str
    # slurmd 24.11 and later refuse to start without a cgroup plugin in a chroot; 22.05 rejects
    # `CgroupPlugin=disabled`.
    cgroup_disabled: bool
    # Slurm 25.11 and later serve OpenMetrics from slurmctld (MetricsType=metrics/openmetrics),
    # and requeue a `--requeue=expedite` job themselves (enable_expedited_requeue).
    slurm_metrics: bool = False

    @property
    def expedited_requeue(self) -> bool:
        return self.slurm_metrics

    @property
    def is_host(self) -> bool:
        return self.suite is None

    @property
    def root(self) -> Path:
        """Named by what it holds: a checkout that wants other packages builds a root of its
        own instead of replacing one that another checkout's lab runs in."""
        digest = hashlib.sha256(f"{self.suite} {' '.join(PACKAGES)}".encode()).hexdigest()
        return cache_dir() / f"{self.name}-{digest[:10]}"

    def exec_dir(self) -> Path:
        """The run directory `lab exec` writes its wrappers into, one per checkout (the
        wrappers bind the checkout's repo)."""
        digest = hashlib.sha256(str(CODE_ROOT).encode()).hexdigest()
        return cache_dir() / f"{self.root.name}.exec-{digest[:10]}"

    @property
    def stamp(self) -> Path:
        return self.root / ".slurmedic-stack.json"

    def built(self) -> bool:
        if self.is_host:
            return True
        try:
            data = json.loads(self.stamp.read_text())
        except (OSError, ValueError):
            return False
        return bool(data.get("packages") == list(PACKAGES))

    def versions(self) -> dict[str, str]:
        """Package versions of the stack (of the host for `bookworm`), as dpkg reports them."""
        if not self.is_host:
            try:
                return dict(json.loads(self.stamp.read_text()).get("versions", {}))
            except (OSError, ValueError):
                return {}
        return _dpkg_versions(None)


STACKS: dict[str, Stack] = {
    s.name: s
    for s in (
        Stack("bookworm", None, "Debian 12, the host", False),
        Stack("trixie", "trixie", "Debian 13", True),
        Stack("sid", "sid", "Debian unstable", True, slurm_metrics=True),
    )
}
# The lab's and the demo's default: Debian's current stable release, with the Slurm (24.11) most
# sites run and an archive that does not change under a build (sid's does, daily).
DEFAULT_STACK = "trixie"


class StackError(ValueError):
    """A stack could not be built or used; the message says why."""


def get(name: str) -> Stack:
    try:
        return STACKS[name]
    except KeyError:
        raise StackError(
            f"stack: {name!r} is not one of {', '.join(STACKS)} (SLURMEDIC_LAB_STACK, --stack)"
        ) from None


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def _dpkg_versions(root: Path | None) -> dict[str, str]:
    argv = ["dpkg-query", "-W", "-f=${Package} ${Version}\\n", *VERSIONS_COMPONENTS]
    if root is not None:
        argv[1:1] = [f"--admindir={root}/var/lib/dpkg"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def debian_mirror() -> str:
    """The Debian archive apt uses on this host (its sources list), unless the env says."""
    if os.environ.get(MIRROR_ENV):
        return os.environ[MIRROR_ENV]
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        with contextlib.suppress(OSError):
            texts.append(path.read_text())
    for text in texts:
        # deb822 (.sources): a URIs line in a stanza whose Suites are Debian's own.
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and _debian_suite(suites.group(1).split()):
                return uris.group(1)
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb":
                rest = [p for p in parts[1:] if not p.startswith("[")]
                if len(rest) >= 2 and _debian_suite([rest[1]]):
                    return rest[0]
    raise StackError(
        f"no Debian archive in apt's sources; set {MIRROR_ENV} to the archive to build from"
    )


def _debian_suite(suites: list[str]) -> bool:
    names = {"bookworm", "trixie", "forky", "sid", "stable", "testing", "unstable"}
    return any(s in names for s in suites)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_built(stack: Stack, *, log: Path | None = None) -> float:
    """Build the stack's root unless it is built; return the seconds the build took (0 if
    cached). Two builders of the same stack wait for each other."""
    if stack.is_host or stack.built():
        return 0.0
    if shutil.which("debootstrap") is None:
        raise StackError("debootstrap is not installed: run ./scripts/setup.sh first")
    t0 = time.monotonic()
    with _lock(stack.root.with_name(stack.root.name + ".lock")):
        if stack.built():
            return 0.0
        work = stack.root.with_name(stack.root.name + ".build")
        if work.exists():
            shutil.rmtree(work)  # a build cut short; its mounts died with its namespace
        argv = [
            # debootstrap mounts /proc and /sys in the root: in a namespace of its own they end
            # with it, even when it is killed, and nothing later removes the root through them.
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            str(stack.suite),
            str(work),
            debian_mirror(),
        ]
        logfile = log or stack.root.with_name(stack.root.name + ".build.log")
        with logfile.open("w") as out:
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
        if proc.returncode != 0:
            raise StackError(
                f"debootstrap of {stack.name} ({stack.suite}) failed ({proc.returncode}); "
                f"see {logfile}"
            )
        # The downloaded packages are of no further use; the root stays about 300 MB.
        for deb in (work / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        stamp = {
            "suite": stack.suite,
            "packages": list(PACKAGES),
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": _dpkg_versions(work),
        }
        (work / ".slurmedic-stack.json").write_text(json.dumps(stamp, indent=1) + "\n")
        work.rename(stack.root)
    return time.monotonic() - t0


def ensure_user(stack: Stack, name: str, uid: int, gid: int) -> None:
    """A user `name` (uid, and a group of its own with gid) in the stack's root, as on the host:
    slurmctld there resolves the uids of requests to names (a person's drain in the accounting
    events). The root is shared by every lab of this checkout; a user is all that is added."""
    if stack.is_host:
        return
    with _lock(stack.root.with_name(stack.root.name + ".lock")):
        users = _id_file(stack.root / "etc" / "passwd")
        groups = _id_file(stack.root / "etc" / "group")
        if users.get(name) == uid and groups.get(name) == gid:
            return
        taken = {i: n for n, i in users.items()}.get(uid)
        if name in users or taken is not None:
            raise StackError(
                f"{stack.root} has user {name} or uid {uid} ({taken}) otherwise than the host: "
                f"remove it there (`userdel --root {stack.root} {name}`)"
            )
        if name not in groups:
            _root_cmd(["groupadd", f"--root={stack.root}", f"--gid={gid}", name])
        _root_cmd(
            ["useradd", f"--root={stack.root}", f"--uid={uid}", f"--gid={gid}",
             "--no-create-home", "--home-dir=/nonexistent", "--shell=/usr/sbin/nologin", name]
        )  # fmt: skip


def _id_file(path: Path) -> dict[str, int]:
    """/etc/passwd or /etc/group: name to uid or gid."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split(":")
        if len(parts) > 2 and parts[2].isdigit():
            out[parts[0]] = int(parts[2])
    return out


def _root_cmd(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise StackError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


# ---- running commands of a stack -------------------------------------------------------------


def binds(run_dir: Path, extra: tuple[Path, ...] = ()) -> list[Path]:
    """Host directories the stack's processes see at their own paths: the repo or site-packages
    (the simulator), slurmedic's resources (the mtail programs), the progress reporter (an
    editable install of it lives in its checkout), the Python slurmedic runs on, and the lab's
    run directory."""
    reporter = Path(slurmedic_progress.__file__).resolve().parents[1]
    paths = [CODE_ROOT, resources.MTAIL_PROGRAMS, reporter, Path(sys.prefix), Path(sys.base_prefix)]
    paths += [run_dir, *extra]
    for p in paths:
        if p.resolve() in (Path("/"), Path("/usr")):
            raise StackError(
                f"{p} cannot be bind-mounted over the stack's own; use a Python outside /usr "
                "(a venv made from one) for the lab's other stacks"
            )
    out: list[Path] = []
    for p in sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts)):
        if not any(p.is_relative_to(q) for q in out):
            out.append(p)
    return out


# The inner script is a constant: the root and the bind paths reach it as arguments, never as
# text of a script, whatever characters they hold.
EXEC_SCRIPT = """#!/bin/sh
# Written by `slurmedic lab up`: runs a command of the {name} stack inside its root, in a mount
# namespace of its own (nothing stays mounted when it ends). Already inside: runs it directly.
case "${{SLURMEDIC_IN_STACK:-}}" in
  "") ;;
  {name}) exec "$@" ;;
  *) echo "stack-exec: inside the $SLURMEDIC_IN_STACK stack, not {name}" >&2; exit 1 ;;
esac
export SLURMEDIC_IN_STACK={name}
exec unshare --mount --propagation private /bin/sh -c '
set -e
R=$1; n=$2; shift 2
mount --rbind /proc "$R/proc"; mount --rbind /sys "$R/sys"; mount --rbind /dev "$R/dev"
mount --bind /etc/hosts "$R/etc/hosts"
while [ "$n" -gt 0 ]; do mount --bind "$1" "$R$1"; shift; n=$((n - 1)); done
exec chroot "$R" /bin/sh -c "cd \\"\\$0\\" 2>/dev/null || cd /; exec \\"\\$@\\"" "$PWD" "$@"
' stack-exec {root} {count} {binds} "$@"
"""


def write_wrappers(stack: Stack, run_dir: Path, extra: tuple[Path, ...] = ()) -> Path | None:
    """Write `<run_dir>/bin/` for a stack other than the host's; return it (None for the host).
    `extra`: further host directories its commands see."""
    bindir = run_dir / "bin"
    if stack.is_host:
        if bindir.exists():
            shutil.rmtree(bindir)
        return None
    if not stack.built():
        raise StackError(f"the {stack.name} stack is not built: `slurmedic lab build {stack.name}`")
    mounts = binds(run_dir, extra)
    for p in mounts:
        (stack.root / p.relative_to("/")).mkdir(parents=True, exist_ok=True)
    (stack.root / "etc" / "hosts").touch()
    bindir.mkdir(parents=True, exist_ok=True)
    script = EXEC_SCRIPT.format(
        name=stack.name,
        root=shlex.quote(str(stack.root)),
        count=len(mounts),
        binds=" ".join(shlex.quote(str(p)) for p in mounts),
    )
    _write_exec(bindir / "stack-exec", script)
    for where, names in COMMANDS.items():
        for name in names:
            target = f"/usr/{where}/{name}"
            body = f'#!/bin/sh\nexec {shlex.quote(str(bindir / "stack-exec"))} {target} "$@"\n'
            _write_exec(bindir / name, body)
    return bindir


def _write_exec(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        # A temporary name of this writer's own: two labs may write the same wrappers at once.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.rename(path)
