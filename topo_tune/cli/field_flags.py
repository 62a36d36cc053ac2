"""A controller's refusal names the request field it refused; the user typed a flag: say the flag.

The admin API names its own fields (``max_parallel_racks``, ``gate.repeats``, ``sizes.min_bytes``,
``search.cudaGraph``), as it must for scripts that call it. A command of this CLI built that request from its
options, so ``spelled`` rewrites an ``INVALID_ARGUMENT`` answer in the command's terms: each field the message
names becomes the option or argument it came from, found by click's parameter names (``gate.repeats`` →
``gate_repeats`` → ``--gate-repeats``; a unit suffix such as ``_s`` and leading sections may be dropped:
``pause_between_s`` → ``--pause-between``, ``sizes.min_bytes`` → ``--min-bytes``); a map option keeps its key
(``thresholds.min_gain`` → ``--threshold min_gain``). The few fields whose parameter has another name are in
``ALIASES``. A flag that was not given is marked ``(not given)``: its default is what was refused. A field
that matches nothing stays as the controller spelled it.

Non-goals: the errors the CLI raises itself (they name the flag already) and ``init``, whose values come from
cluster.yaml and whose refusals name its keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import click
from click.core import ParameterSource
from pydantic.alias_generators import to_snake

from topo_tune.errors import RequestRefused

ALIASES: Mapping[str, Mapping[str, str]] = {
    "admin rediscover": {"node_name": "node_names", "command_id_prefix": "command_id"},
    "admin config show": {"id": "version_id"},
    "admin config export": {"id": "version_id"},
    "admin config diff": {"id": "old_id new_id"},
    "admin credential revoke": {"id": "credential_id"},
    "admin drift run": {"config_version": "version"},
    "admin bench run": {"env": "env_pairs"},
    "env": {"nodes": "node_args"},
    "exec": {"nodes": "node_args"},
    "hostfile": {"nodes": "node_args"},
}
"""Per command (its path below ``topo-tune``): request fields whose parameter has another name (several names:
either of them)."""

_UNIT_SUFFIXES = ("_s",)
_QUOTED = r"'[^']*'|\"[^\"]*\""
_PATH = r"[a-z][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[(?:\d+|'[^']*')\])*"
_TOKEN = re.compile(rf"{_QUOTED}|(?<![\w.\-]){_PATH}")
_PART = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\['([^']*)'\]")


@contextmanager
def naming_flags(ctx: click.Context) -> Iterator[None]:
    """Re-raise a controller's refusal with the fields it names spelled as ``ctx``'s flags. Only a refusal: a
    ``ValidationError`` this client raised about a reply names the reply's field, which no flag set."""
    try:
        yield
    except RequestRefused as error:
        field, reason = spelled(ctx, error.field, error.reason)
        raise RequestRefused(field, reason) from None


def spelled(ctx: click.Context, field: str, reason: str) -> tuple[str, str]:
    """``(field, reason)`` with every request field in them named as the flag of ``ctx``'s command."""
    if not field:  # a message that starts with its field: "dtype 'x' is not supported"
        word, _, rest = reason.partition(" ")
        if rest and _flag(ctx, word):
            field, reason = word, rest
    flag = _flag(ctx, field) if field else None

    def token(found: re.Match[str]) -> str:
        text = found.group()
        if text[0] in "'\"" or not re.search(r"[_.\[A-Z]", text):  # a value, or a plain word of the sentence
            return text
        return (_flag(ctx, f"{field}.{text}") if field and "." not in text else None) or _flag(ctx, text) or text

    rewritten = _TOKEN.sub(token, reason)
    if flag is not None:
        return flag, rewritten
    if rewritten != reason:  # a section's own check ("gate: maxBytes must not be below minBytes"): its flags say it
        return "", rewritten
    return field, reason


def _flag(ctx: click.Context, path: str) -> str | None:
    """The option or argument of ``ctx``'s command that request field ``path`` came from, as typed."""
    if not re.fullmatch(_PATH, path):
        return None
    parts, key = _parts(path)
    params = {p.name: p for p in ctx.command.params if p.name}
    aliases = ALIASES.get(" ".join(ctx.command_path.split()[1:]), {})
    names = [to_snake(part) for part in parts]
    for start in range(len(names)):
        # The whole rest of the path names a parameter, or all but its last part names a map option (its key).
        for end, map_key in ((len(names), key), (len(names) - 1, parts[-1])):
            name = "_".join(names[start:end])
            for candidate in (name, *(name.removesuffix(s) for s in _UNIT_SUFFIXES if name.endswith(s))):
                found = [params[n] for n in aliases.get(candidate, candidate).split() if n in params]
                if not candidate or not found or (end < len(names) and not _is_map(found[0])):
                    continue
                shown = " or ".join(_shown(ctx, p) for p in found)
                return f"{shown} {map_key}" if map_key and _is_map(found[0]) else shown
    return None


def _parts(path: str) -> tuple[list[str], str]:
    """``search.cudaGraph`` → (["search", "cudaGraph"], ""); ``files['bad']`` → (["files"], "bad");
    list indices are dropped (the reason quotes the value)."""
    parts: list[str] = []
    key = ""
    for name, _index, quoted in _PART.findall(path):
        if name:
            parts.append(name)
        elif quoted:
            key = quoted
    return parts, key


def _is_map(param: click.Parameter) -> bool:
    return isinstance(param, click.Option) and param.multiple


def _shown(ctx: click.Context, param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        text = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    else:
        text = param.human_readable_name.strip("[].")
    source = ctx.get_parameter_source(param.name) if param.name else None
    return f"{text} (not given)" if source in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP) else text
