"""The PNG of ETTR against checkpoint interval, a line a policy (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from webhook.simulate.run import Outcome


def ettr_plot(sweep: dict[str, list[Outcome]], minutes: list[float], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    from matplotlib import pyplot

    fig, ax = pyplot.subplots(figsize=(8, 5))
    policies = [o.policy for o in next(iter(sweep.values()))]
    for i, policy in enumerate(policies):
        ettr = [outcomes[i].ettr_cluster for outcomes in sweep.values()]
        ax.plot(minutes, ettr, marker="o", label=policy)
    ax.set_xticks(minutes, [f"{m:g}" for m in minutes])
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("ETTR (cluster, GPU-weighted)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    pyplot.close(fig)
