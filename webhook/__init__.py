"""slurmedic: failure attribution and guarded recovery for GPU training jobs on Slurm."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("slurmedic")  # pyproject.toml's, as installed: its one home
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
