"""What an agent may say about its node's topology: every text field of ``NodeTopology``, its class and bound.

An agent's topology report (its registration, a rediscovery's result) is stored and shown to every admin
(``admin node``, ``admin topology``, the report), and its names reach NCCL's topology file. So every string
in it is checked against one table, ``FIELDS``: a field is a host name (``names.address``), a token a machine
wrote (``names.token``: a PCI bus id, a device name, a cpulist) or plain text a person reads
(``names.plain_text``: a GPU's or CPU's model, a version, what discovery could not tell), each with its length
bound. A string field missing from the table is refused, so a field added to the proto is refused until it
is given a class here (a test keeps the table complete). Errors name the field by its path
(``register.topology.nics[1].name``) and never quote the value.

Non-goals: judging whether the topology is true or consistent (the topology model does), and sizes of the
whole message and of its lists (``validation.register`` bounds those first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from topo_tune.controller import names
from topo_tune.errors import ValidationError

Kind = Literal["host", "token", "text"]

_CHECKS: Mapping[Kind, Callable[[str, str, int], object]] = {
    "host": lambda value, field, _limit: names.address(value, field),
    "token": lambda value, field, limit: names.token(value, field, limit=limit),
    "text": lambda value, field, limit: names.plain_text(value, field, limit=limit),
}

FIELDS: Mapping[tuple[str, str], tuple[Kind, int]] = {
    ("NodeTopology", "hostname"): ("host", 253),
    ("NodeTopology", "unknowns"): ("text", 1024),
    ("NodeTopology", "cpu_model"): ("text", 256),
    ("NodeTopology", "source"): ("text", 256),
    ("Gpu", "uuid"): ("token", 128),
    ("Gpu", "name"): ("text", 128),
    ("Gpu", "pci_bus_id"): ("token", 64),
    ("Gpu", "sm_arch"): ("token", 32),
    ("Gpu", "cpu_affinity"): ("token", 4096),
    ("Gpu", "pci_path"): ("token", 1024),
    ("Nic", "name"): ("token", 128),
    ("Nic", "port_state"): ("text", 64),
    ("Nic", "gid_types"): ("text", 64),
    ("Nic", "pci_path"): ("token", 1024),
    ("Nic", "netdevs"): ("token", 128),
    ("Nic", "pci_bus_id"): ("token", 64),
    ("Nic", "device"): ("token", 128),
    ("ExcludedNic", "name"): ("token", 128),
    ("ExcludedNic", "reason"): ("text", 1024),
    ("NicAffinity", "nic"): ("token", 128),
    ("SoftwareVersions", "nccl"): ("text", 128),
    ("SoftwareVersions", "driver"): ("text", 128),
    ("SoftwareVersions", "cuda"): ("text", 128),
    ("SoftwareVersions", "torch"): ("text", 128),
    ("SoftwareVersions", "topo_tune"): ("text", 128),
    ("SoftwareVersions", "kernel"): ("text", 128),
    ("NcclXmlElement", "tag"): ("token", 64),
    ("NcclXmlAttribute", "name"): ("token", 64),
    ("NcclXmlAttribute", "value"): ("text", 4096),
}
"""(message, field) → the field's class and its most characters."""


def check_topology(message: Message, where: str) -> None:
    """Every string set in ``message`` (a ``NodeTopology`` or a part of one) against ``FIELDS``."""
    for field, value in message.ListFields():
        path = f"{where}.{field.name}"
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for i, part in enumerate(value) if field.is_repeated else [(None, value)]:
                check_topology(part, path if i is None else f"{path}[{i}]")
        elif field.type == FieldDescriptor.TYPE_STRING:
            rule = FIELDS.get((message.DESCRIPTOR.name, field.name))
            if rule is None:
                raise ValidationError(path, "not a field this controller accepts text in")
            kind, limit = rule
            for i, text in enumerate(value) if field.is_repeated else [(None, value)]:
                _CHECKS[kind](text, path if i is None else f"{path}[{i}]", limit)
