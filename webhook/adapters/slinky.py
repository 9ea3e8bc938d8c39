"""What SchedMD's Slinky slurm-operator (Slurm on Kubernetes) writes into Slurm, read back.

Each Slurm node of a NodeSet is a slurmd pod, named after the pod (`<nodeset>-<ordinal>`), and
the operator keeps the pod's place in the node's comment: a JSON object naming the namespace, the
pod and the Kubernetes node it runs on. dcgm-exporter names the Kubernetes node, so an alert's
host is read as the Slurm node whose pod runs there (webhook.core.node_names). The operator's own
drain reasons begin with OPERATOR_REASON; any other reason is an external drain it keeps and never
clears, slurmedic's among them (webhook.core.incidents.REASON)."""

from __future__ import annotations

import json

OPERATOR_REASON = "slurm-operator:"


def pod_host(comment: str) -> str:
    """The Kubernetes node of a Slinky slurmd pod, from its Slurm node's comment (the operator's
    `{"namespace": ..., "podName": ..., "node": ...}`); "" for any other comment."""
    if not comment.startswith("{"):
        return ""
    try:
        info = json.loads(comment)
    except ValueError:
        return ""
    if not isinstance(info, dict) or not isinstance(info.get("podName"), str):
        return ""
    node = info.get("node")
    return node if isinstance(node, str) else ""
