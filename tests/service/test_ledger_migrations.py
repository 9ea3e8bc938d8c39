"""Schema migrations: a ledger written by the previous release (a61be39, the last without
Alembic) upgrades when the new Ledger opens it, on SQLite and on PostgreSQL, and every row it
held stays readable; opening it again changes nothing; processes opening a new ledger at once
all find it made once; the migrated schema is the models'."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import make_url

from tests.service.conftest import PG_BIN
from webhook.core.cluster import ClusterView
from webhook.core.decisions import Decision
from webhook.core.engine import Engine, Snapshot
from webhook.ledger import migrate
from webhook.ledger.schema import Base
from webhook.ledger.settings import Breaker, Heartbeat, Jobs, Nodes, Switch
from webhook.ledger.store import Ledger

DATA = Path(__file__).parents[1] / "data" / "ledger"  # written by write_previous.py
T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
_databases = count()


def schema_drift(ledger: Ledger) -> list[object]:
    with ledger.engine.connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))


def stamped(ledger: Ledger) -> str | None:
    with ledger.engine.connect() as conn:
        return migrate.revision(conn)


def assert_previous_rows(ledger: Ledger) -> None:
    """Everything write_previous.py wrote, read back through the new Ledger."""
    assert ledger.notification_count() == 1
    alerts = ledger.alerts_after(0)
    assert [(a.labels["node"], a.status) for _, _, a in alerts] == [
        ("gpu01", "firing"),
        ("gpu02", "firing"),
    ]
    drain, requeue = sorted(ledger.decisions(), key=lambda r: r.id)
    assert (drain.action, drain.nodes, drain.state) == ("drain", ["gpu01"], "executed")
    assert (requeue.action, requeue.exclude, requeue.state) == ("requeue", ["gpu01"], "executed")
    found = ledger.decision(drain.id)
    assert found is not None
    assert [e.state for e in found[1]] == ["pending", "running", "executed", "note"]
    assert found[1][-1].detail["diagnostics"] == {"nodes": {}}
    (incident,) = ledger.restore_incidents(since=T - timedelta(hours=1))
    assert (incident.key, incident.current) == ("7.0", True)
    assert incident.carried == {"drain", "requeue"}
    engine = Engine(view=ClusterView())
    engine.restore(Snapshot(incidents=[incident]))
    assert engine.incidents["7.0"].closed  # what ran closes it: the engine's rule
    (recovery,) = ledger.recoveries()
    assert (recovery.state, recovery.restored_seconds) == ("recovered", 300)
    assert ledger.setting(Breaker) == Breaker(open=False, reset_at=T - timedelta(hours=1))
    assert ledger.setting(Switch).monitor is True
    assert ledger.setting(Heartbeat).at == T.timestamp()
    jobs = ledger.setting(Jobs).root
    assert set(jobs) == {"7"} and (jobs["7"].restarts, jobs["7"].eligible) == (1, True)
    assert ledger.setting(Nodes).root["gpu01"].status == "drained"
    delays = {
        t.action: t.executed_at - t.fault_at for t in ledger.figures().timings if t.executed_at
    }
    assert delays == {"drain": timedelta(seconds=25), "requeue": timedelta(seconds=28)}
    # And it takes new rows after the old ones.
    (new,) = ledger.record(
        [
            Decision(
                at=T + timedelta(hours=1),
                incident="8.0",
                job=8,
                action="escalate",
                cause="unknown",
                reason="after the upgrade",
            )
        ]
    )
    assert new == requeue.id + 1
    assert [h.job for h in ledger.history(T)].count(8) == 1


def sqlite_dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return list(conn.iterdump())


def previous_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "a61be39.db"
    shutil.copy(DATA / "a61be39.db", path)
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "decisions" in tables and "alembic_version" not in tables  # as that release left it
    return path


def test_a_sqlite_ledger_of_the_previous_release_upgrades(tmp_path: Path) -> None:
    path = previous_sqlite(tmp_path)
    ledger = Ledger(f"sqlite:///{path}")
    assert stamped(ledger) == migrate.head()
    assert schema_drift(ledger) == []
    assert_previous_rows(ledger)
    ledger.engine.dispose()
    before = sqlite_dump(path)
    again = Ledger(f"sqlite:///{path}")  # opening it twice is a no-op
    again.engine.dispose()
    assert sqlite_dump(path) == before


def test_the_revisions_read_from_the_files_are_alembics() -> None:
    """A ledger at head is checked without Alembic, against the revisions' file names: they
    must be the revisions Alembic walks, in its order."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(migrate._config())
    walked = tuple(reversed([s.revision for s in scripts.walk_revisions()]))
    assert migrate.shipped() == walked
    assert migrate.head() == scripts.get_current_head()


def alembic_imported(url: str) -> bool:
    """Whether a fresh interpreter that opens the ledger at `url` imports Alembic."""
    probe = (
        "import sys; from webhook.ledger.store import Ledger; "
        f"Ledger({url!r}); print(any(m.startswith('alembic') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return {"True": True, "False": False}[out.stdout.strip()]


def test_a_ledger_at_head_opens_without_importing_alembic(tmp_path: Path) -> None:
    assert alembic_imported(f"sqlite:///{tmp_path / 'l.db'}")  # a new ledger: made by Alembic
    assert not alembic_imported(f"sqlite:///{tmp_path / 'l.db'}")  # at head: read, not migrated


def test_a_ledger_from_before_fault_at_gets_the_column(tmp_path: Path) -> None:
    """Older still: decisions without fault_at (the release before a61be39 added it by hand)."""
    path = previous_sqlite(tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE decisions DROP COLUMN fault_at")
    ledger = Ledger(f"sqlite:///{path}")
    assert schema_drift(ledger) == []
    assert [r.fault_at for r in ledger.decisions()] == [None, None]
    assert {r.state for r in ledger.decisions()} == {"executed"}
    assert ledger.figures().timings == []  # no fault time kept on the rows of then


@pytest.mark.parametrize(
    ("stamp", "refused"),
    [
        ("UPDATE alembic_version SET version_num = '0099'", r"revision '0099'.*newer release"),
        ("INSERT INTO alembic_version VALUES ('0003')", r"several revisions at once"),
    ],
)
def test_a_ledger_stamped_as_this_release_cannot_read_is_refused_by_name(
    tmp_path: Path, stamp: str, refused: str
) -> None:
    path = tmp_path / "l.db"
    Ledger(f"sqlite:///{path}").engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute(stamp)
    with pytest.raises(migrate.SchemaError, match=refused):
        Ledger(f"sqlite:///{path}")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_processes_opening_a_new_ledger_at_once_make_it_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'l.db'}"
        if backend == "sqlite"
        else new_database(request.getfixturevalue("postgres_url"))
    )
    code = f"from webhook.ledger.store import Ledger; Ledger({url!r})"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    ledger = Ledger(url)
    assert stamped(ledger) == migrate.head()
    assert schema_drift(ledger) == []


def new_database(server_url: str) -> str:
    """A fresh, empty database on the test server; its URL."""
    url = make_url(server_url)
    name = f"upgrade_{next(_databases)}"
    subprocess.run(
        [str(PG_BIN[-1] / "createdb"), "-h", str(url.host), "-p", str(url.port),
         "-U", str(url.username), name],
        check=True, capture_output=True,
    )  # fmt: skip
    return url.set(database=name).render_as_string(hide_password=False)


def test_a_postgresql_ledger_of_the_previous_release_upgrades(postgres_url: str) -> None:
    url = new_database(postgres_url)
    pg = make_url(url)
    # The previous release's own ledger on PostgreSQL (pg_dump of write_previous.py's run).
    subprocess.run(
        [str(PG_BIN[-1] / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-h", str(pg.host),
         "-p", str(pg.port), "-U", str(pg.username), "-d", str(pg.database),
         "-f", str(DATA / "a61be39.pg.sql")],
        check=True, capture_output=True,
    )  # fmt: skip
    ledger = Ledger(url)
    assert stamped(ledger) == migrate.head()
    assert schema_drift(ledger) == []
    assert_previous_rows(ledger)
    again = Ledger(url)
    assert stamped(again) == migrate.head()
    assert len(again.decisions()) == 3


def test_a_new_postgresql_ledger_has_the_models_schema(postgres_url: str) -> None:
    ledger = Ledger(new_database(postgres_url))
    assert stamped(ledger) == migrate.head()
    assert schema_drift(ledger) == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_ledger_two_loops_wrote_keeps_every_decision_and_gets_the_key(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Before 0004 two loops could record the same decision twice: the upgrade numbers the
    copies (revision 0, 1, ...) so the unique key can be made, and drops none."""
    from alembic import command
    from sqlalchemy import create_engine, text

    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'twice.db'}"
    else:
        url = new_database(request.getfixturevalue("postgres_url"))
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(migrate._config(conn), "0003")
        for state in ("executed", "failed", "superseded"):
            conn.execute(
                text(
                    "INSERT INTO decisions (at, incident, job, action, cause, nodes, exclude, "
                    "reason, evidence, mode, state) VALUES (:at, '7.0', 7, 'requeue', "
                    "'unknown', '[]', '[]', 'twice', '[]', 'enforce', :state)"
                ),
                {"at": T, "state": state},
            )
    engine.dispose()
    ledger = Ledger(url)
    assert stamped(ledger) == migrate.head()
    assert schema_drift(ledger) == []
    rows = ledger.incident_decisions("7.0")
    assert [(r.state, r.revision) for r in rows] == [
        ("executed", 0),
        ("failed", 1),
        ("superseded", 0),
    ]
