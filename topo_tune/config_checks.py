"""Settings errors in one line naming the field, and settings overridden then validated again as a whole.

pydantic reports ``('racks', 2, 'nodes', 0, 'gpus')`` and "Input should be a valid integer"; a user reads
``racks[2].nodes[0].gpus: expected integer, got 'eight'``. ``validated`` and ``naming_fields`` raise such an
error (``ConfigError`` for a file or flag, ``ValidationError`` for a request); ``overridden`` puts a flag's or
request's values over a section and validates the whole again (``model_copy`` checks nothing).

Non-goal: the settings themselves (``cluster_config.py``).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from typing import TypeVar

import pydantic
from pydantic import BaseModel

from topo_tune.errors import ConfigError, FieldError, PathError

_REASONS = {
    "int_parsing": "expected integer",
    "int_type": "expected integer",
    "int_from_float": "expected integer",
    "float_parsing": "expected number",
    "float_type": "expected number",
    "string_type": "expected string",
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
    "missing": "required field is missing",
    "extra_forbidden": "unknown key",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
}


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _format_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or part.startswith("function-"):
            continue  # pydantic's validator tags, not fields
        elif not _KEY.match(part):
            out += f"[{json.dumps(part)}]"  # an odd key ("", a newline, spaces) stays visible and on one line
        else:
            out += f".{part}" if out else part
    return out


def field_errors(exc: pydantic.ValidationError) -> list[tuple[str, str]]:
    """(path, reason) of each error, as cluster.yaml's messages spell them."""
    found: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        path = _format_path(tuple(err["loc"]))
        ctx_error = err.get("ctx", {}).get("error")
        if isinstance(ctx_error, PathError):
            found.append((ctx_error.path, ctx_error.reason))
            continue
        kind = err["type"]
        reason = _REASONS.get(kind)
        if reason is None:
            reason = str(err["msg"]).removeprefix("Value error, ")
            reason = reason[:1].lower() + reason[1:]
        elif kind not in ("missing", "extra_forbidden"):
            reason = f"{reason}, got {err['input']!r}"
        found.append((path, reason))
    return found


Section = TypeVar("Section", bound=BaseModel)


@contextlib.contextmanager
def naming_fields(*, where: str = "", error: type[FieldError] = ConfigError) -> Iterator[None]:
    """Turns a model's ``pydantic.ValidationError`` into one ``error`` naming every bad field (under ``where``)."""
    try:
        yield
    except pydantic.ValidationError as exc:
        errors = [(".".join(p for p in (where, f) if p), r) for f, r in field_errors(exc)]
        first_field, first_reason = errors[0]
        more = "; ".join(f"{f}: {r}" for f, r in errors[1:])
        raise error(first_field, first_reason + (f"; {more}" if more else "")) from None


def validated(
    model: type[Section], data: Mapping[str, object], *, where: str = "", error: type[FieldError] = ConfigError
) -> Section:
    """``data`` as a ``model``, or ``error`` naming every bad field (under ``where``, e.g. ``gate``)."""
    with naming_fields(where=where, error=error):
        return model.model_validate(data)
    raise AssertionError("unreachable")  # for mypy: the context manager re-raises


def overridden(
    settings: Section, updates: Mapping[str, object], *, where: str = "", error: type[FieldError] = ConfigError
) -> Section:
    """``settings`` with ``updates`` in place (snake_case names), validated again as a whole: a command-line
    flag or a request's value gets the checks, and the error, of the file's own key (``model_copy`` checks
    nothing)."""
    if not updates:
        return settings
    return validated(type(settings), {**settings.model_dump(exclude_unset=True), **updates}, where=where, error=error)
