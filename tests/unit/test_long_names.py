"""Node names of 64 characters (Linux's HOST_NAME_MAX; cloud providers' host names run to 60 and
more) in every incident key, every drain reason and every playbook's extra vars (issue 36): the
patterns are the playbooks' own (playbooks/vars/slurmedic.yml, compiled by
webhook.core.patterns), their bounds follow from one another, and what slurmedic builds stays
within them — a resume of many long names too. The real playbooks' own checks with these names:
tests/service/test_long_names_playbooks.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from webhook.core.incidents import MAX_LEN, BadIncidentKey, IncidentKey, drain_reason
from webhook.core.patterns import DRAIN_REASON, INCIDENT, NODE_NAME, playbook_vars_file
from webhook.core.policy import CAUSES
from webhook.executor.diagnostics import keep
from webhook.executor.dispatch import playbook_for
from webhook.executor.runner import PLAYBOOK_VARS, DiagnosticsVars, DrainVars, RunResult
from webhook.ledger.schema import DecisionRow, IncidentRow

# As GKE names an A3 node in its VPC's DNS: 64 characters, the most a host name may have.
N64 = "a3-megagpu-8g-pretrain-pool-0001.us-central1-a.c.ml-prd.internal"
N65 = N64.replace("ml-prd", "ml-prod")
HOST_NAME_MAX = 64
COUNT_MAX = 999_999  # an idle node's failure count has up to 6 digits, as an attempt's
# Room a reason keeps after its key and cause, for words a later change adds (" repeat 2 in 7d").
ROOM = 40
SLURMDBD_REASON_BYTES = 255  # slurmdbd keeps a node event's reason in a MySQL tinytext


def longest(pattern: re.Pattern[str], prefix: str = "") -> int:
    """The length of the longest text `prefix` + `a`* that `pattern` matches (`a` is in every
    class of these patterns; each is bounded)."""
    n = 0
    while pattern.match(prefix + "a" * (n + 1)):
        n += 1
        assert n < 10_000, f"{pattern.pattern} has no bound"
    assert pattern.match(prefix + "a" * n)
    return len(prefix) + n


def test_the_names_are_as_long_as_the_tests_say() -> None:
    assert (len(N64), len(N65)) == (HOST_NAME_MAX, HOST_NAME_MAX + 1)


def test_each_bound_follows_from_the_node_name_s() -> None:
    assert longest(NODE_NAME) == HOST_NAME_MAX
    # The longest key a playbook sees: a node's n-th repair.
    node_key = len(f"repair:{'a' * HOST_NAME_MAX}:{COUNT_MAX}")
    assert node_key == 78 == len(str(IncidentKey.repairing("a" * HOST_NAME_MAX, COUNT_MAX)))
    assert longest(INCIDENT) == node_key
    # Every other kind is shorter: an idle node's n-th failure, a job attempt's, a recovery
    # check's.
    assert len(str(IncidentKey.of_node("a" * HOST_NAME_MAX, COUNT_MAX))) < node_key
    assert len(str(IncidentKey.verifying(9_999_999_999, COUNT_MAX))) < node_key
    # A drain reason: the prefix, the longest key, the longest cause, and room to spare ...
    cause = max(len(c) for c in CAUSES)
    assert longest(DRAIN_REASON, "slurmedic: ") >= len("slurmedic: ") + node_key + 1 + cause + ROOM
    # ... within what Slurm's accounting keeps of a reason.
    assert longest(DRAIN_REASON, "slurmedic: ") <= SLURMDBD_REASON_BYTES
    # The ledger's columns hold every key.
    assert node_key <= MAX_LEN
    assert IncidentRow.__table__.c.key.type.length == MAX_LEN  # type: ignore[attr-defined]
    assert DecisionRow.__table__.c.incident.type.length == MAX_LEN  # type: ignore[attr-defined]


def test_the_vars_file_says_why() -> None:
    text = playbook_vars_file().read_text()
    assert "HOST_NAME_MAX" in text and "`repair:` (7) + a node" in text and "tinytext" in text


@pytest.mark.parametrize(
    "text",
    [
        f"{N64[:20]};{N64[21:]}",
        f"{N64[:20]}/{N64[21:]}",
        f"{N64[:20]} {N64[21:]}",
        f"{N64[:63]}\n",
        f"-{N64[1:]}",
    ],
)
def test_a_long_name_is_held_to_the_same_characters(text: str) -> None:
    assert len(text) == HOST_NAME_MAX
    assert not NODE_NAME.match(text)
    with pytest.raises(BadIncidentKey):
        IncidentKey.of_node(text)


KEYS = [
    IncidentKey.of_node(N64),
    IncidentKey.of_node(N64, 2),
    IncidentKey.of_node(N64, 12),
    IncidentKey.of_node(N64, COUNT_MAX),
    IncidentKey.of_attempt(9_999_999_999, COUNT_MAX),
    IncidentKey.verifying(9_999_999_999, COUNT_MAX),
]


@pytest.mark.parametrize("key", KEYS, ids=[f"{k.kind}-{k.seq}" for k in KEYS])
def test_every_key_of_a_64_character_name_passes_the_playbooks_checks(key: IncidentKey) -> None:
    text = str(key)
    assert IncidentKey.parse(text) == key
    assert INCIDENT.match(text), (len(text), text)
    assert len(text) <= MAX_LEN
    # As the executor builds them: the drain's extra vars and the diagnostics'.
    row = DecisionRow(
        incident=text, job=key.job, action="drain", cause="gpu_hardware", nodes=[N64], exclude=[]
    )
    target = playbook_for(row)
    assert target is not None
    name, extravars = target
    assert extravars["slurmedic_reason"] == f"slurmedic: {text} gpu_hardware"
    PLAYBOOK_VARS[name].model_validate(extravars)
    DiagnosticsVars(slurmedic_nodes=[N64], slurmedic_incident=text)
    # Requeue excluding the node, and readmitting it.
    row = DecisionRow(
        incident=text, job=7, action="requeue", cause="gpu_hardware", nodes=[], exclude=[N64]
    )
    row.readmit = [N64]
    target = playbook_for(row)
    assert target is not None
    PLAYBOOK_VARS[target[0]].model_validate(target[1])


@pytest.mark.parametrize("cause", CAUSES)
def test_every_cause_makes_a_reason_the_playbook_takes_with_the_longest_key(cause: str) -> None:
    reason = drain_reason(str(IncidentKey.of_node(N64, COUNT_MAX)), cause)
    assert DRAIN_REASON.match(reason)
    DrainVars(slurmedic_nodes=[N64], slurmedic_reason=reason)


def test_a_reason_keeps_room_for_more_words() -> None:
    key = str(IncidentKey.of_node(N64, COUNT_MAX))
    note = "repeat 12 in 7d - hardware suspect: RMA"  # about as long as the room kept
    assert len(note) <= ROOM
    reason = drain_reason(key, "shared_infrastructure", note)
    assert reason == f"slurmedic: {key} shared_infrastructure {note}"
    assert DRAIN_REASON.match(reason)


def test_a_note_too_long_gives_way_word_by_word() -> None:
    key = str(IncidentKey.of_node(N64, COUNT_MAX))
    note = " ".join(f"word{i}" for i in range(40))
    reason = drain_reason(key, "gpu_hardware", note)
    assert DRAIN_REASON.match(reason)
    assert reason.startswith(f"slurmedic: {key} gpu_hardware word0 word1 ")
    kept = reason.removeprefix(f"slurmedic: {key} gpu_hardware ").split()
    assert kept == note.split()[: len(kept)]
    # One more word would not have fitted.
    assert not DRAIN_REASON.match(f"{reason} {note.split()[len(kept)]}")
    # Without a note, or with one the pattern refuses outright, the key and the cause stay.
    assert drain_reason(key, "gpu_hardware") == f"slurmedic: {key} gpu_hardware"
    assert drain_reason(key, "gpu_hardware", "a;b") == f"slurmedic: {key} gpu_hardware"


def test_a_65_character_name_is_still_refused_everywhere() -> None:
    assert not NODE_NAME.match(N65)
    with pytest.raises(BadIncidentKey):
        IncidentKey.of_node(N65)
    with pytest.raises(BadIncidentKey):
        IncidentKey.parse(f"node:{N65}:2")
    with pytest.raises(BadIncidentKey):
        IncidentKey.repairing(N65)
    with pytest.raises(BadIncidentKey):
        IncidentKey.parse(f"repair:{N65}:2")
    with pytest.raises(ValidationError):
        DrainVars(slurmedic_nodes=[N65], slurmedic_reason="slurmedic: 7.0 gpu_hardware")
    with pytest.raises(ValidationError):
        DiagnosticsVars(slurmedic_nodes=[N65], slurmedic_incident="7.0")
    # A key or a reason one character past its bound.
    with pytest.raises(ValidationError):
        DiagnosticsVars(slurmedic_nodes=[N64], slurmedic_incident=f"repair:{N64}:1234567")
    with pytest.raises(ValidationError):
        DrainVars(slurmedic_nodes=[N64], slurmedic_reason="slurmedic: " + "a" * 161)


# Resumes: a human's (`slurmedic resume`). Their keys never reach a playbook, only the ledger.
POOL = [N64.replace("0001", f"{i:04d}") for i in range(1, 41)]
OTHER = [f"{n}-b"[-HOST_NAME_MAX:] for n in POOL]  # as long, the numbers elsewhere


def test_a_resume_of_long_names_is_listed_while_it_fits() -> None:
    one = str(IncidentKey.resuming((N64,)))
    assert one == f"resume:{N64}"
    pool = str(IncidentKey.resuming(tuple(POOL)))
    assert pool == "resume:a3-megagpu-8g-pretrain-pool-[0001-0040].us-central1-a.c.ml-prd.internal"
    assert IncidentKey.parse(pool).nodes == tuple(sorted(POOL))


def test_a_resume_too_long_to_list_keeps_a_short_unique_readable_key() -> None:
    everything = tuple(POOL[::2] + OTHER)
    key = str(IncidentKey.resuming(everything))
    first = sorted(everything)[0]
    assert len(key) <= MAX_LEN
    # The first name and how many more (people read it), and a digest (nothing else shares it).
    assert re.fullmatch(rf"resume:{re.escape(first)},\+{len(everything) - 1}:[0-9a-f]{{8}}", key)
    assert IncidentKey.parse(key).nodes == (first,)
    # Another set, the same first name and as many nodes: another key.
    others = tuple(POOL[:1] + POOL[1::2][1:] + OTHER)
    assert len(set(others)) == len(everything) and sorted(others)[0] == first
    assert str(IncidentKey.resuming(others)) != key
    # The same set, in any order: the same key.
    assert str(IncidentKey.resuming(tuple(reversed(everything)))) == key


def test_diagnostics_of_a_long_name_fit_the_file_system(tmp_path: Path) -> None:
    """`<artifacts>/<incident>/<node>/<file>`: each part at most 78 or 64 bytes, far below
    NAME_MAX (255)."""
    incident = str(IncidentKey.repairing(N64, COUNT_MAX))
    ok = {"rc": "0", "stdout": "<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>"}
    result = RunResult("collect_diagnostics", True, "successful", 0)
    result.diagnostics = {N64: {"node": N64, "nvidia_smi": ok, "dmesg": ok, "slurmd_log": ok}}
    note = keep(result, tmp_path, incident)
    folder = Path(note["nodes"][N64]["artifacts"])
    assert folder == tmp_path / incident.replace(":", "_") / N64
    assert sorted(p.name for p in folder.iterdir()) == [
        "dmesg.txt",
        "nvidia-smi.xml",
        "slurmd.log",
        "summary.txt",
    ]
    assert max(len(part.encode()) for part in folder.relative_to(tmp_path).parts) <= 78
