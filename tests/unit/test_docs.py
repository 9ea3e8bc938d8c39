"""The docs a newcomer reads hold together: every relative link in the README, CHANGELOG and
docs/ leads to a file of the repository, nothing points outside it, and the README stays a
few pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
        elif not path.is_relative_to(REPO):
            broken.append(f"{target} (outside the repository)")
    assert not broken, broken


def test_nothing_points_outside_the_repository() -> None:
    for page in PAGES:
        text = page.read_text()
        assert "../shared" not in text and "DESIGN.md" not in text, page


def test_the_readme_starts_with_the_two_commands_and_stays_short() -> None:
    text = (REPO / "README.md").read_text()
    first = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[0] for line in first] == ["./scripts/demo.sh", "./scripts/test.sh"]
    assert len(text.split()) < 1200
    for page in ("docs/deploy.md", "docs/architecture.md", "CHANGELOG.md"):
        assert page in text, page
