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
# The investigatory action that makes a RESTART_APP code's application a victim, not the cause.
SYMPATHETIC = "IGNORE (sympathetic)"


def catalog() -> dict[int, dict[str, str]]:
    with (RULES / "nvidia-xid-catalog.tsv").open() as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header, body = rows[0], rows[1:]
    code, h100, action, investigatory = header.index("Code"), 5, 8, 9
    assert "H100" in header[h100] and "Immediate" in header[action], header
    assert "Investigatory" in header[investigatory], header
    return {
        int(r[code]): {
            "h100": r[h100],
            "current": "YES" if "YES" in r[h100 : h100 + 3] else "NO",
            "action": r[action].strip(),
            "investigatory": r[investigatory].strip(),
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
        ("contained", {"RESTART_APP"}),
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
            klass = "contained" if row["investigatory"] == SYMPATHETIC else "application"
            assert code in cls[klass], f"XID {code} (RESTART_APP) belongs in {klass}"


def test_contained_holds_exactly_the_restart_app_codes_whose_application_was_a_victim() -> None:
    """docs/operations.md: where the catalog's investigatory column says "IGNORE (sympathetic)", the
    application that hit the XID was its victim: it restarts and the GPU is reset when
    convenient (gpu_degraded), never the owner's bug (gpu_app)."""
    victims = {
        code
        for code, row in catalog().items()
        if row["current"] == "YES"
        and row["action"] == "RESTART_APP"
        and row["investigatory"] == SYMPATHETIC
    }
    assert victims, "the catalog names no sympathetic RESTART_APP code: is the column still 9?"
    assert set(classes()["contained"]) == victims


def test_the_classes_hold_the_well_known_codes() -> None:
    cls = classes()
    assert {48, 64, 79, 95, 119, 120} <= set(cls["node"])
    assert {13, 31, 43} & set(cls["application"]) == {13, 31}  # 43 is IGNORE
    # A contained memory error (94) is the victim's, not the application's; an uncontained one
    # (95, sympathetic too) needs the GPU reset before anything runs again.
    assert 94 in cls["contained"] and 94 not in cls["application"]
    assert 95 not in cls["contained"]
