"""The XID classes stay in step with NVIDIA's XID catalog (alert_rules/nvidia-xid-catalog.tsv)."""

import csv
from pathlib import Path

import pytest
import yaml

RULES = Path(__file__).resolve().parents[2] / "alert_rules"
NODE_ACTIONS = {
    "RESET_GPU",
    "RESTART_BM",
    "RESTART_VM",
    "CONTACT_SUPPORT",
    "WORKFLOW_XID_48",
    "WORKFLOW_NVLINK_ERR",
    "WORKFLOW_NVLINK5_ERR",
    "CHECK_MECHANICALS",
    "UPDATE_SWFW",
}
INFORMATIONAL_ACTIONS = {"WORKFLOW_XID_45", "XID_154", "CHECK_UVM", ""}


def catalog() -> dict[int, dict[str, str]]:
    with (RULES / "nvidia-xid-catalog.tsv").open() as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header, body = rows[0], rows[1:]
    code, h100, action = header.index("Code"), 5, 8
    assert "H100" in header[h100] and "Immediate" in header[action], header
    return {
        int(r[code]): {
            "h100": r[h100],
            "current": "YES" if "YES" in r[h100 : h100 + 3] else "NO",
            "action": r[action].strip(),
        }
        for r in body
        if r[code]
    }


def classes() -> dict[str, list[int]]:
    data: dict[str, list[int]] = yaml.safe_load((RULES / "xid-classes.yml").read_text())
    return data


def test_every_current_xid_that_needs_action_is_in_exactly_one_class() -> None:
    """H100 as the issue asks, and B100/GB200 so a Blackwell cluster is covered too."""
    cls = classes()
    for code, row in catalog().items():
        if row["current"] != "YES" or row["action"] == "IGNORE":
            continue
        owners = [name for name, codes in cls.items() if code in codes]
        assert len(owners) == 1, f"XID {code} ({row['action'] or 'no action'}) is in {owners}"


def test_ignore_codes_raise_nothing() -> None:
    cls = classes()
    for code, row in catalog().items():
        if row["action"] == "IGNORE":
            assert all(code not in codes for codes in cls.values()), f"XID {code} is IGNORE"


@pytest.mark.parametrize(
    ("klass", "allowed"),
    [
        ("node", NODE_ACTIONS | {""}),
        ("application", {"RESTART_APP"}),
        ("informational", INFORMATIONAL_ACTIONS),
    ],
)
def test_each_class_holds_only_codes_of_its_actions(klass: str, allowed: set[str]) -> None:
    cat = catalog()
    for code in classes()[klass]:
        assert code in cat, f"XID {code} in {klass} is not in the catalog"
        assert cat[code]["action"] in allowed, f"XID {code} is {cat[code]['action']}, not {klass}"


def test_codes_of_node_and_application_actions_are_all_classified() -> None:
    """Also for Blackwell (B100, GB200): a cluster of those must not miss NVLink5 XIDs."""
    cls = classes()
    for code, row in catalog().items():
        if row["action"] in NODE_ACTIONS and row["current"] == "YES":
            assert code in cls["node"], f"XID {code} ({row['action']}) belongs in node"
        if row["action"] == "RESTART_APP" and row["current"] == "YES":
            assert code in cls["application"], f"XID {code} (RESTART_APP) belongs in application"


def test_the_node_class_holds_the_well_known_codes() -> None:
    assert {48, 64, 79, 95, 119, 120} <= set(classes()["node"])
    assert {13, 31, 94} <= set(classes()["application"])
