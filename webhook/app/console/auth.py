"""Who uses the console, and what they may do: users with roles from a file of password hashes,
or a trusted reverse proxy's user header. Separate from the webhook's token: people log in here,
Alertmanager never does.

    viewer    reads incidents, the queue and the report; records verdicts
    approver  also approves and rejects recommendations
    admin     also flips the global switch and resets the breaker
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from flask import abort, current_app, g, redirect, request, session, url_for
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError
from werkzeug.security import check_password_hash

from webhook.core.validation import describe
from webhook.core.verdicts import WHO
from webhook.files import FileError, load_mapping

Role = Literal["viewer", "approver", "admin"]
RANK: dict[str, int] = {"viewer": 0, "approver": 1, "admin": 2}
F = TypeVar("F", bound=Callable[..., Any])


class User(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    password_hash: str = Field(min_length=20)
    role: Role = "viewer"


class Users(RootModel[dict[str, User]]):
    pass


class UsersError(ValueError):
    """A users file that does not load; the message names the file and the key."""


def load_users(path: Path) -> dict[str, User]:
    try:
        users = Users.model_validate(load_mapping(path, "console users file")).root
    except FileError as e:
        raise UsersError(str(e)) from e
    except ValidationError as e:
        raise UsersError(f"{path}: {describe(e)}") from e
    bad = [name for name in users if not valid_name(name)]
    if bad:
        raise UsersError(f"{path}: {bad[0]!r}: a user name is letters, digits and ._@- only")
    return users


def valid_name(name: str) -> bool:
    return re.fullmatch(WHO, name) is not None


@dataclass(frozen=True)
class Identity:
    name: str
    role: str

    def may(self, role: str) -> bool:
        return RANK[self.role] >= RANK[role]


def settings() -> Any:
    return current_app.extensions["slurmedic"]["console"]


def check_login(name: str, password: str) -> Identity | None:
    path = settings().users_file
    if path is None:
        return None
    user = load_users(path).get(name)
    if user is None or not check_password_hash(user.password_hash, password):
        return None
    return Identity(name, user.role)


def current() -> Identity | None:
    """Who is logged in: the proxy's header (trusted: the console is bound to loopback or
    behind the proxy), else the session."""
    header = settings().proxy_user_header
    if header:
        name = request.headers.get(header, "")
        if name and valid_name(name):
            return Identity(name, settings().proxy_roles.get(name, "viewer"))
        return None
    user, role = session.get("user"), session.get("role")
    if isinstance(user, str) and isinstance(role, str) and role in RANK:
        return Identity(user, role)
    return None


def require(role: str) -> Callable[[F], F]:
    """The view needs a login with at least `role`: a login page otherwise, 403 if too low."""

    def wrap(view: F) -> F:
        @functools.wraps(view)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            who = current()
            if who is None:
                return redirect(url_for("console.login", next=request.full_path))
            if not who.may(role):
                abort(403, f"{who.name} is a {who.role}; this needs a {role}")
            g.user = who
            return view(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    return wrap
