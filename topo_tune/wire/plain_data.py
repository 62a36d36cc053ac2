"""The plain form of a wire message, for ``-o json`` and ``-o yaml``: the stable scripting interface.

Plain values, as kubectl prints them:

* enum values as lower-case words without their type's prefix (``NODE_STATE_READY`` → ``ready``,
  ``NIC_LINK_LAYER_INFINIBAND`` → ``infiniband``; an unset enum is ``unspecified``);
* every integer as a number, 64-bit ones included (protobuf's own JSON prints those as strings);
* timestamps in RFC 3339 (UTC, ``Z``); an unset one is ``null``;
* every field of a message, under its proto field name; an unset ``optional`` field or message is ``null``;
  of a ``oneof``, only the member that is set;
* a float that is not finite as the string ``NaN``, ``Infinity`` or ``-Infinity`` (JSON has no such number).

The admin client gives each answer's plain form with its domain value, so the CLI prints it without knowing the
messages. Non-goals: reading data back into messages, printing (``cli/output.py``).
"""

from __future__ import annotations

import base64
import math
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp


def to_data(message: Message) -> dict[str, Any]:
    """``message`` as plain JSON/YAML-ready data (see the module docstring for the conventions)."""
    data: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        oneof = field.containing_oneof
        synthetic = oneof is not None and oneof.name == f"_{field.name}"  # proto3 ``optional``
        if oneof is not None and not synthetic and message.WhichOneof(oneof.name) != field.name:
            continue
        entry = field.message_type if field.type == FieldDescriptor.TYPE_MESSAGE else None
        if entry is not None and field.is_repeated and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            data[field.name] = {
                str(key): _plain(value, value_field.enum_type)
                for key, value in sorted(getattr(message, field.name).items(), key=lambda item: str(item[0]))
            }
        elif field.is_repeated:
            data[field.name] = [_plain(value, field.enum_type) for value in getattr(message, field.name)]
        elif field.has_presence and not message.HasField(field.name):
            data[field.name] = None
        else:
            data[field.name] = _plain(getattr(message, field.name), field.enum_type)
    return data


def enum_word(enum: EnumDescriptor, number: int) -> str:
    """The plain word for an enum value: its name less the type's UPPER_SNAKE prefix, lower-cased."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    return value.name.removeprefix(_prefix(enum)).lower()


def _plain(value: Any, enum: Any) -> Any:
    """``value`` of a field whose enum type is ``enum`` (None: not an enum), as plain data."""
    if isinstance(value, Timestamp):
        return value.ToJsonString() if (value.seconds or value.nanos) else None
    if isinstance(value, Duration):
        return value.ToTimedelta().total_seconds()
    if isinstance(value, Message):
        return to_data(value)
    if enum is not None:
        return enum_word(enum, value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _prefix(enum: EnumDescriptor) -> str:
    """The prefix every value of ``enum`` shares, up to an underscore (``NODE_STATE_`` of NodeState)."""
    words = [v.name.split("_") for v in enum.values]
    shared = 0
    while len(words) > 1 and all(len(w) > shared + 1 and w[shared] == words[0][shared] for w in words):
        shared += 1
    return "".join(f"{word}_" for word in words[0][:shared])
