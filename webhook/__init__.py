"""slurmedic: failure attribution and guarded recovery for GPU training jobs on Slurm."""

__version__ = "0.1.0"
