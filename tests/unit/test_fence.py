"""The replica's fence file (webhook/executor/fence.py): what its playbooks' acts read."""

from __future__ import annotations

from pathlib import Path

from webhook.executor.fence import WIDTH, Fence


def test_a_new_fence_allows_nothing(tmp_path: Path) -> None:
    fence = Fence(tmp_path / "fence")
    assert fence.read() == 0.0
    assert len((tmp_path / "fence").read_text()) == WIDTH


def test_renewals_move_it_on_never_back(tmp_path: Path) -> None:
    fence = Fence(tmp_path / "fence")
    fence.extend(1_800_000_000.25)
    fence.extend(1_799_999_999.0)  # a slower renewal's
    assert fence.read() == 1_800_000_000.25
    assert float((tmp_path / "fence").read_text()) == 1_800_000_000.25


def test_an_ended_term_revokes_it_and_a_new_one_extends_it_again(tmp_path: Path) -> None:
    fence = Fence(tmp_path / "fence")
    fence.extend(1_800_000_000.0)
    fence.revoke()
    assert fence.read() == 0.0
    fence.extend(1_800_000_005.0)
    assert fence.read() == 1_800_000_005.0


def test_a_fence_of_its_own_is_removed_on_close() -> None:
    fence = Fence()
    assert fence.path.exists()
    fence.close()
    assert not fence.path.exists()
