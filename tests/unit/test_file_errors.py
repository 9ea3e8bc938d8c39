"""Every command that reads an operator's file answers a bad one with one line naming the file
(and the line of a YAML error), never a traceback: missing, a directory, not YAML, not a
mapping; and the same for the secrets and the rule config."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from webhook.cli import main
from webhook.files import FileError, load_mapping, parse_yaml
from webhook.rules.render import RULES_DIR, RulesError, RuleSource
from webhook.service.config import Auth, ConfigError


def missing(tmp: Path) -> tuple[Path, str]:
    return tmp / "nope.yml", "nope.yml: no such "


def directory(tmp: Path) -> tuple[Path, str]:
    (tmp / "adir").mkdir()
    return tmp / "adir", "adir: is a directory, not a "


def not_yaml(tmp: Path) -> tuple[Path, str]:
    (tmp / "bad.yml").write_text("mode: monitor\nscope: {partitions: [gpu}\nx: 1\n")
    return tmp / "bad.yml", "bad.yml:2: not YAML ("


def a_list(tmp: Path) -> tuple[Path, str]:
    (tmp / "list.yml").write_text("- mode\n- monitor\n")
    return tmp / "list.yml", "list.yml: a "


def not_text(tmp: Path) -> tuple[Path, str]:
    (tmp / "bin.yml").write_bytes(b"mode: \xff\xfe\n")
    return tmp / "bin.yml", "bin.yml: not a text file ("


DEFECTS = [missing, directory, not_yaml, a_list, not_text]


def token_config(tmp: Path) -> Path:
    (tmp / "token").write_text("s3cret\n")
    config = tmp / "config.yml"
    config.write_text(f"auth:\n  bearer_token_file: {tmp / 'token'}\n")
    return config


# Each command with the file in the place it reads one; the serve/loop ones fail before they
# start anything, on the file.
COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "policy check": lambda f, _tmp: ["policy", "check", str(f)],
    "replay": lambda f, _tmp: ["replay", str(f), "--json"],
    "decisions list --config": lambda f, _tmp: ["decisions", "list", "--config", str(f)],
    "cluster show --config": lambda f, _tmp: ["cluster", "show", "--config", str(f)],
    "serve --config": lambda f, _tmp: ["serve", "--config", str(f)],
    "serve --policy": lambda f, tmp: [
        "serve",
        "--config",
        str(token_config(tmp)),
        "--policy",
        str(f),
    ],
    "loop --policy": lambda f, _tmp: ["loop", "--policy", str(f)],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("defect", DEFECTS)
def test_a_bad_file_is_one_line_naming_it(
    tmp_path: Path, command: str, defect: Callable[[Path], tuple[Path, str]]
) -> None:
    path, message = defect(tmp_path)
    result = CliRunner().invoke(main, COMMANDS[command](path, tmp_path))
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    assert result.exit_code in (1, 2)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert message in lines[0] and str(path) in lines[0]


def test_the_kind_of_file_is_named(tmp_path: Path) -> None:
    path, _ = a_list(tmp_path)
    with pytest.raises(
        FileError, match=r"list\.yml: a policy file is a mapping of keys, not a list$"
    ):
        load_mapping(path, "policy file")
    with pytest.raises(FileError, match=r"nope\.yml: no such scenario$"):
        load_mapping(tmp_path / "nope.yml", "scenario")
    (tmp_path / "empty.yml").write_text("# nothing yet\n")
    assert load_mapping(tmp_path / "empty.yml") == {}


def test_a_yaml_error_names_the_line_it_was_found_on() -> None:
    with pytest.raises(FileError, match=r"^x\.yml:3: not YAML \(mapping values are not allowed"):
        parse_yaml("a: 1\nb: 2\nc: d: e\n", "x.yml")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda tmp: None, r"^auth\.bearer_token_file: .*token: no such secret file$"),
        (lambda tmp: (tmp / "token").mkdir(), r"^auth\.bearer_token_file: .*token: is a directory"),
        (
            lambda tmp: (tmp / "token").write_text("\n"),
            r"^auth\.bearer_token_file: .*token is empty$",
        ),
    ],
)
def test_a_bad_bearer_token_file_is_named(
    tmp_path: Path, setup: Callable[[Path], object], message: str
) -> None:
    setup(tmp_path)
    with pytest.raises(ConfigError, match=message):
        Auth(bearer_token_file=tmp_path / "token").secrets()


def test_serve_with_a_missing_bearer_token_file_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yml"
    config.write_text(f"auth:\n  bearer_token_file: {tmp_path / 'gone'}\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(config)])
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.output.strip() == (
        f"Error: auth.bearer_token_file: {tmp_path / 'gone'}: no such secret file"
    )


def test_a_missing_basic_password_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^auth\.basic_password_file: .*pw: no such secret file"):
        Auth(basic_user="am", basic_password_file=tmp_path / "pw").secrets()


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    return copy


def test_a_yaml_error_in_the_rule_config_is_named_with_its_line(rules: Path) -> None:
    config = rules / "config.yml"
    lines = config.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  runbook_base: "))
    lines[at] = "  runbook_base: a: b"
    config.write_text("\n".join(lines) + "\n")
    with pytest.raises(RulesError, match=rf"^{config}:{at + 1}: not YAML \(mapping values"):
        RuleSource(rules).render()


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("config.yml", "- defaults\n", r"config\.yml: a rules config file is a mapping of keys"),
        ("config.yml", "profiles: {}\n", r"config\.yml: defaults: must be a mapping"),
        ("xid-classes.yml", "node: [79]\n", r"xid-classes\.yml: application: missing"),
    ],
)
def test_a_rule_config_of_the_wrong_shape_is_named(
    rules: Path, name: str, text: str, message: str
) -> None:
    (rules / name).write_text(text)
    with pytest.raises(RulesError, match=message):
        RuleSource(rules).render()


def test_a_missing_rule_config_is_named(rules: Path) -> None:
    (rules / "xid-classes.yml").unlink()
    with pytest.raises(RulesError, match=r"xid-classes\.yml: no such rules config file$"):
        RuleSource(rules).config()


def test_a_template_rendering_broken_yaml_is_named(rules: Path) -> None:
    template = next((rules / "templates").glob("*.rules.yml"))
    template.write_text(template.read_text() + "\n  - broken: [\n")
    with pytest.raises(RulesError, match=rf"^{template.name} \(rendered\):\d+: not YAML"):
        RuleSource(rules).render()


def test_a_config_value_that_is_not_a_duration_names_the_file_and_key(rules: Path) -> None:
    """Before any template renders (the rule config's keys are typed: webhook/rules/config.py)."""
    config = rules / "config.yml"
    config.write_text(config.read_text().replace("hang_after: 10m", "hang_after: 10min", 1))
    with pytest.raises(RulesError, match=rf"^{re.escape(str(config))}: hang_after: '10min' is not"):
        RuleSource(rules).render()


@pytest.mark.parametrize(
    ("listen", "said"),
    [
        ("0.0.0.0:99999", "listen: port 99999 is not within 1-65535"),
        ("localhost", "listen: 'localhost' is not HOST:PORT (e.g. 127.0.0.1:8080)"),
        ("127.0.0.1:http", "listen: '127.0.0.1:http' is not HOST:PORT (e.g. 127.0.0.1:8080)"),
        ("unix:", "listen: unix: needs a socket path"),
    ],
)
def test_a_listen_address_gunicorn_cannot_bind_is_one_line(
    tmp_path: Path, listen: str, said: str
) -> None:
    config = token_config(tmp_path)
    config.write_text(config.read_text() + f"listen: '{listen}'\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(config)])
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.output.strip() == f"Error: {config}: {said}"


# A fresh interpreter where the PostgreSQL driver is not installed (the extra left out).
NO_PSYCOPG = """
import importlib.abc, sys

class NoDriver(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "psycopg" or name.startswith("psycopg."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoDriver())
from webhook.cli import main
main(sys.argv[1:])
"""


def test_postgresql_without_its_extra_says_how_to_install_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yml"
    config.write_text("database_url: postgresql+psycopg://slurmedic@127.0.0.1:1/slurmedic\n")
    out = subprocess.run(
        [sys.executable, "-c", NO_PSYCOPG, "decisions", "list", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "Error: database_url: postgresql needs the driver psycopg, which is not installed: "
        "install slurmedic with its postgres extra (pip install 'slurmedic[postgres]', or "
        f"'FILE.whl[postgres]') [{config}]"
    ], out.stderr


def test_a_secret_file_others_can_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="slurmedic.config"):
        Auth(bearer_token_file=token).secrets()
    assert [r.getMessage() for r in caplog.records] == [
        f"auth.bearer_token_file: {token} is readable by others (mode 0644): chmod 600 it"
    ]
    caplog.clear()
    token.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="slurmedic.config"):
        Auth(bearer_token_file=token).secrets()
    assert caplog.records == []
