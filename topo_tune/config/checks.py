"""Settings errors in one line naming the field, and settings overridden then validated again as a whole.

pydantic reports ``('racks', 2, 'nodes', 0, 'gpus')`` and "Input should be a valid integer"; a user reads
``racks[2].nodes[0].gpus: expected integer, got 'eight'``. ``validated`` and ``naming_fields`` raise such an
error (``ConfigError`` for a file or flag, ``ValidationError`` for a request); ``overridden`` puts a flag's or
request's values over a section and validates the whole again (``model_copy`` checks nothing).

Non-goal: the settings themselves (``config/cluster.py``).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
import typing
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel

from topo_tune.config.values import PATTERN_WORDS
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


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*\Z")


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


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The settings model an annotation holds, through ``list[...]``, ``dict[str, ...]`` and ``Optional``."""
    while not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if not args:
            return None
        annotation = args[-1]
    return annotation


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys (as the file spells them) the section at ``loc`` of ``model`` accepts; [] when unknown."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue  # an index of a list: the same model
        field = next((f for name, f in current.model_fields.items() if part in (name, f.alias)), None)
        current = _model_in(field.annotation) if field is not None else None
    return [] if current is None else [f.alias or name for name, f in current.model_fields.items()]


def _shown(value: object) -> str:
    """A value as the YAML file spelled it: ``null`` for an empty value, not Python's ``None``."""
    return "null (an empty value)" if value is None else repr(value)


def _did_you_mean(key: object, known: list[str]) -> str:
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def field_errors(exc: pydantic.ValidationError, model: type[BaseModel] | None = None) -> list[tuple[str, str]]:
    """(path, reason) of each error, as cluster.yaml's messages spell them; with ``model``, an unknown key
    names the closest key the section accepts ("did you mean 'search'?")."""
    found: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        path = _format_path(tuple(err["loc"]))
        ctx_error = err.get("ctx", {}).get("error")
        if isinstance(ctx_error, PathError):
            found.append((ctx_error.path, ctx_error.reason))
            continue
        kind = err["type"]
        if kind == "string_pattern_mismatch":
            words = PATTERN_WORDS.get(str(err.get("ctx", {}).get("pattern")), "not in the expected form")
            found.append((path, f"{words}, got {_shown(err['input'])}"))
            continue
        reason = _REASONS.get(kind)
        if reason is None:
            reason = str(err["msg"]).removeprefix("Value error, ")
            reason = reason[:1].lower() + reason[1:]
        elif kind == "extra_forbidden" and model is not None and err["loc"]:
            reason += _did_you_mean(err["loc"][-1], _keys_at(model, tuple(err["loc"][:-1])))
        elif kind not in ("missing", "extra_forbidden"):
            reason = f"{reason}, got {_shown(err['input'])}"
        found.append((path, reason))
    return found


Section = TypeVar("Section", bound=BaseModel)


@contextlib.contextmanager
def naming_fields(
    *, where: str = "", error: type[FieldError] = ConfigError, model: type[BaseModel] | None = None
) -> Iterator[None]:
    """Turns a model's ``pydantic.ValidationError`` into one ``error`` naming every bad field (under ``where``);
    with the ``model`` validated, a mistyped key gets the closest accepted one."""
    try:
        yield
    except pydantic.ValidationError as exc:
        errors = [(".".join(p for p in (where, f) if p), r) for f, r in field_errors(exc, model)]
        first_field, first_reason = errors[0]
        more = "; ".join(f"{f}: {r}" for f, r in errors[1:])
        raise error(first_field, first_reason + (f"; {more}" if more else "")) from None


def validated(
    model: type[Section], data: Mapping[str, object], *, where: str = "", error: type[FieldError] = ConfigError
) -> Section:
    """``data`` as a ``model``, or ``error`` naming every bad field (under ``where``, e.g. ``gate``)."""
    with naming_fields(where=where, error=error, model=model):
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
