"""Command-line flags that override one cluster.yaml setting: help, default and bounds come from the model.

``setting_option(DriftConfig, "sample_nodes", "--drift-sample-nodes")`` gives a flag whose help is the field's
description with its key and default (``[cluster.yaml controller.drift.sampleNodes, else 2]``) and whose value
is checked by the field's own type (a duration such as ``6h``, a size such as ``16M``, the field's bounds), so
a bad value is refused naming the flag with the reason cluster.yaml would give. The flag's value is None when
not given: the caller applies what was given with ``cluster_config.overridden``.

Non-goal: flags that no cluster.yaml key backs (they stay plain click options).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import click
import pydantic
from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from topo_tune.config.checks import field_errors
from topo_tune.config.values import parse_bytes, parse_duration, show_bytes, show_duration

F = TypeVar("F", bound=Callable[..., Any])


def _validator(field: pydantic.fields.FieldInfo) -> Callable[..., Any] | None:
    for item in field.metadata:
        if isinstance(item, pydantic.BeforeValidator):
            return item.func
    return None


def show_default(field: pydantic.fields.FieldInfo) -> str:
    """The field's default as cluster.yaml would spell it: ``6h``, ``1M``, ``0.1``, ``true``."""
    value = field.default
    parser = _validator(field)
    if parser is parse_duration:
        return show_duration(value)
    if parser is parse_bytes:
        return show_bytes(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


class SettingValue(click.ParamType[Any]):
    """A flag's value checked by one model field's type; ``off`` (e.g. ``"0"``) passes as 0 where given."""

    def __init__(self, field: pydantic.fields.FieldInfo, *, off: str | None = None) -> None:
        annotation: Any = field.annotation
        if field.metadata:
            annotation = Annotated[annotation, *field.metadata]
        self._adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(annotation)
        self._off = off
        parser = _validator(field)
        kinds = {parse_duration: "duration", parse_bytes: "size"}
        numbers = {int: "integer", float: "number"}
        self.name = kinds.get(parser) or numbers.get(field.annotation, "text")  # type: ignore[arg-type]

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return self.name.upper()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if self._off is not None and isinstance(value, str) and value.strip() == self._off:
            return 0
        try:
            return self._adapter.validate_python(value)
        except pydantic.ValidationError as exc:
            self.fail("; ".join(reason for _, reason in field_errors(exc)), param, ctx)


def setting_option(
    model: type[BaseModel],
    name: str,
    *decls: str,
    key: str | None,
    off: str | None = None,
    default_text: str | None = None,
    help: str | None = None,
    envvar: str | None = None,
    metavar: str | None = None,
) -> Callable[[F], F]:
    """A flag for ``model``'s field ``name``, documented as cluster.yaml's ``key`` (the section's path; None:
    the flag's default is the model's, whatever cluster.yaml says)."""
    field = model.model_fields[name]
    description = help or field.description or name.replace("_", " ")
    default = default_text or ("unset" if field.default is None else show_default(field))
    source = f"cluster.yaml {key}.{field.alias or to_camel(name)}, else " if key is not None else ""
    off_note = f"; {off}: off" if off is not None else ""
    env_note = f"${envvar}, else " if envvar else ""
    text = f"{description[:1].upper()}{description[1:]}{off_note} [{env_note}{source}{default}]."
    if field.annotation is bool:
        if len(decls) == 1:
            flag = decls[0].removeprefix("--")
            decls = (f"--{flag}/--no-{flag}",)
        return click.option(*decls, default=None, help=text)
    if get_origin(field.annotation) is Literal:
        return click.option(*decls, type=click.Choice(get_args(field.annotation)), default=None, help=text)
    return click.option(
        *decls, type=SettingValue(field, off=off), default=None, envvar=envvar, metavar=metavar, help=text
    )
