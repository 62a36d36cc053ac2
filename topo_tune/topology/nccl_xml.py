"""NCCL topology XML as an element tree: parse it with line numbers, write it back as NCCL does.

Purpose: the `<system>` element tree NCCL reads and writes (``XmlNode`` while parsing, the ``NcclXmlElement``
message once kept), the PCI class codes NCCL writes on it, and ``NcclXmlError`` naming the line of a
malformed file.

Non-goals: what the elements mean (``nccl_dump`` reads a node from them, ``nccl_topo_file`` builds them), and
graph files (``NCCL_GRAPH_FILE``), which only matter in an expert mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.parsers import expat

from topo_tune.errors import NcclXmlError
from topo_tune.v1 import topology_pb2

Element = topology_pb2.NcclXmlElement
# PCI class codes NCCL writes on a <pci> element.
GPU_CLASSES = ("0x0300", "0x0302")
IB_CLASS = "0x0207"
ETH_CLASS = "0x0200"
BRIDGE_CLASS = "0x060400"
NVSWITCH_CLASS = "0x0680"


@dataclass
class XmlAttribute:
    name: str
    value: str


@dataclass
class XmlNode:
    """A parsed element that remembers its line, so later checks can name it."""

    tag: str
    attributes: list[XmlAttribute] = field(default_factory=list)
    children: list[XmlNode] = field(default_factory=list)
    line: int | None = None

    def to_element(self) -> Element:
        element = Element(tag=self.tag)
        for a in self.attributes:
            element.attributes.add(name=a.name, value=a.value)
        element.children.extend(child.to_element() for child in self.children)
        return element


def attr(element: Element | XmlNode, name: str) -> str | None:
    for a in element.attributes:
        if a.name == name:
            return a.value
    return None


def parse_xml(text: str, *, source: str = "<nccl-xml>") -> XmlNode:
    """Parse XML text into `XmlNode`s; a syntax error raises `NcclXmlError` with expat's line."""
    parser = expat.ParserCreate()
    parser.ordered_attributes = True
    stack: list[XmlNode] = []
    roots: list[XmlNode] = []

    def start(tag: str, attrs: list[str]) -> None:
        node = XmlNode(
            tag=tag,
            attributes=[XmlAttribute(attrs[i], attrs[i + 1]) for i in range(0, len(attrs), 2)],
            line=parser.CurrentLineNumber,
        )
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)

    def end(tag: str) -> None:
        stack.pop()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(text, True)
    except expat.ExpatError as exc:
        raise NcclXmlError(expat.errors.messages[exc.code], line=exc.lineno, source=source) from exc
    if not roots or roots[0].tag != "system":
        raise NcclXmlError("the root element must be <system>", line=1, source=source)
    return roots[0]


def render_xml(root: Element) -> str:
    """Write elements the way NCCL does: two-space indent, attributes in order, ``/>`` for empty elements."""
    lines: list[str] = []

    def emit(element: Element, depth: int) -> None:
        attrs = "".join(f' {a.name}="{_escape(a.value)}"' for a in element.attributes)
        pad = "  " * depth
        if element.children:
            lines.append(f"{pad}<{element.tag}{attrs}>")
            for child in element.children:
                emit(child, depth + 1)
            lines.append(f"{pad}</{element.tag}>")
        else:
            lines.append(f"{pad}<{element.tag}{attrs}/>")

    emit(root, 0)
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
