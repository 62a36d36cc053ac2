"""What a valid name or id looks like: node and rack names, command, benchmark and job ids, study ids, short texts.

The domain services check the names they are handed with these (a service may be called in-process, not only
through the admin API); ``api/validation.py`` checks whole wire messages with them. Each raises
``ValidationError`` naming the field. Non-goal: checking that a named thing exists (the services do that).
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Mapping

from topo_tune.errors import ValidationError
from topo_tune.ids import NodeName, RolloutId, StudyId

NODE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9\-_.]{0,251}[A-Za-z0-9])?\Z")
COMMAND_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")
STUDY_ID = NODE_NAME
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+=\-]{0,252}\Z")
"""A job's own id as launchers spell it: Slurm's digits, torchrun's run id, PMIx namespaces (``prterun-h-1@1``),
a Kubernetes uid. No '/', space or control character: it is stored, logged and exported to the job."""
MAX_LABELS = 64
MAX_LABEL_KEY = 317  # a 253-character prefix, "/", a 63-character name, as Kubernetes allows
MAX_LABEL_VALUE = 256
MAX_SHORT = 128
TOKEN = re.compile(r"^[A-Za-z0-9._:/+@,=\-]*\Z")
"""A word a machine wrote (a PCI bus id, a device or netdev name, a cpulist, a path, a version id, a label key):
ASCII letters, digits and ``._:/+@,=-``; no space, no quote, no markup bracket, no control character."""
_TEXT_CATEGORIES = frozenset({"L", "M", "N", "P", "S"})
"""Unicode's letters, marks, numbers, punctuation and symbols: what ``plain_text`` allows, with spaces. Left out:
controls, format characters (bidirectional overrides, zero-width ones), line and paragraph separators,
surrogates, private-use and unassigned code points."""


def node_name(value: str, field: str) -> NodeName:
    if not value:
        raise ValidationError(field, "required")
    if len(value) > 253 or not NODE_NAME.match(value):
        raise ValidationError(field, f"not a valid node name (RFC 1123, at most 253 characters): {value[:80]!r}")
    return NodeName(value)


def study_id(value: str, field: str = "study_id") -> StudyId:
    if not value:
        raise ValidationError(field, "required")
    if len(value) > 253 or not STUDY_ID.match(value):
        raise ValidationError(
            field, f"not a valid study id (letters, digits, '-_.', at most 253 characters): {value[:80]!r}"
        )
    return StudyId(value)


def job_id(value: str, field: str = "job_id", *, required: bool = True) -> str:
    if not value:
        if required:
            raise ValidationError(field, "required")
        return value
    if not JOB_ID.match(value):
        raise ValidationError(
            field, f"not a valid job id (letters, digits, '_.:@+=-', at most 253 characters): {value[:80]!r}"
        )
    return value


def command_id(value: str, field: str) -> str:
    if not value:
        raise ValidationError(field, "required")
    if not COMMAND_ID.match(value):
        raise ValidationError(field, f"not a valid command id (letters, digits, '_.-', at most 64): {value[:80]!r}")
    return value


def rollout_id(value: str, field: str = "rollout_id") -> RolloutId:
    """A rollout id is spelt as a command id."""
    return RolloutId(command_id(value, field))


def address(value: str, field: str) -> str:
    """Where peers reach a node: a host name or an IP literal, at most 253 characters; empty: none given.

    It becomes a job's ``TOPO_TUNE_MASTER_ADDR`` and a launcher's host, so nothing else (a space, a flag, a
    newline) is ever stored."""
    if not value:
        return value
    if len(value) > 253:
        raise ValidationError(field, "longer than 253 characters: expected a host name or an IP address")
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not NODE_NAME.match(value):
            raise ValidationError(field, "expected a host name or an IP address") from None
    return value


def plain_text(value: str, field: str, *, limit: int = MAX_SHORT) -> str:
    """``short_text`` of printable characters only (text a person reads as is): letters, marks, digits,
    punctuation, symbols and spaces; a control, bidirectional or zero-width character is refused by its code."""
    short_text(value, field, limit=limit)
    for char in value:
        category = unicodedata.category(char)
        if category[0] not in _TEXT_CATEGORIES and category != "Zs":
            kind = "a control or bidirectional character" if category in ("Cc", "Cf") else "a character"
            raise ValidationError(field, f"holds {kind} that is not printable text (U+{ord(char):04X})")
    return value


def token(value: str, field: str, *, limit: int = MAX_SHORT) -> str:
    """``short_text`` spelt as ``TOKEN``: a word a machine wrote."""
    short_text(value, field, limit=limit)
    if not TOKEN.match(value):
        raise ValidationError(field, "allowed characters are letters, digits and '._:/+@,=-'")
    return value


def short_text(value: str, field: str, *, limit: int = MAX_SHORT) -> str:
    if len(value) > limit:
        raise ValidationError(field, f"longer than {limit} characters")
    return value


def labels(values: Mapping[str, str], field: str) -> dict[str, str]:
    """At most ``MAX_LABELS``; each key a ``TOKEN`` (Kubernetes' ``prefix/name`` fits), each value plain text."""
    if len(values) > MAX_LABELS:
        raise ValidationError(field, f"{len(values)} labels, at most {MAX_LABELS} allowed")
    for key, value in sorted(values.items()):  # the first bad label named is the same in any order the map came in
        if not key or len(key) > MAX_LABEL_KEY:
            raise ValidationError(f"{field}[{key[:40]!r}]", f"key must be 1 to {MAX_LABEL_KEY} characters")
        where = f"{field}[{key!r}]"
        if not TOKEN.match(key):
            raise ValidationError(
                f"{field}[{key[:40]!a}]", "key: allowed characters are letters, digits and '._:/+@,=-'"
            )
        if len(value) > MAX_LABEL_VALUE:
            raise ValidationError(where, f"value longer than {MAX_LABEL_VALUE} characters")
        plain_text(value, where, limit=MAX_LABEL_VALUE)
    return dict(values)
