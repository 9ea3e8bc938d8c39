"""`slurmedic console user FILE NAME`: add or change a console user in a users file."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from webhook.app.console.auth import User, UsersError, load_users, valid_name


@click.group()
def console() -> None:
    """The review console's users (the console itself runs in `slurmedic serve`)."""


@console.command()
@click.argument("users_file", type=click.Path(path_type=Path))
@click.argument("name")
@click.option("--role", type=click.Choice(["viewer", "approver", "admin"]), default="viewer")
@click.password_option(help="The user's password (asked for when not given).")
def user(users_file: Path, name: str, role: str, password: str) -> None:
    """Add NAME to USERS_FILE (created if missing), or change their password and role."""
    from werkzeug.security import generate_password_hash

    if not valid_name(name):
        raise click.ClickException(f"name: {name!r}: letters, digits and ._@- only")
    try:
        users = load_users(users_file) if users_file.exists() else {}
    except UsersError as e:
        raise click.ClickException(str(e)) from e
    users[name] = User(password_hash=generate_password_hash(password), role=role)  # type: ignore[arg-type]
    body = {n: u.model_dump() for n, u in sorted(users.items())}
    users_file.parent.mkdir(parents=True, exist_ok=True)
    users_file.touch(mode=0o600)
    users_file.write_text(yaml.safe_dump(body, sort_keys=True))
    click.echo(f"{users_file}: {name} ({role})")
