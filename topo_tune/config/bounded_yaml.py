"""YAML read with bounds on size, nesting depth and alias expansion, for files an operator hands in.

PyYAML's safe loader shares aliased objects, so an anchor/alias "bomb" builds quickly, but everything that
walks the result afterwards (validation, schema checks) sees the fully expanded tree: nine levels of nine
aliases is 387 million nodes. Deep nesting overflows the composer's recursion. Here the composed node graph
is measured before any Python object is built: past a bound the text is refused with one line naming the
bound. A key given twice in one mapping is an error naming the key and both lines (PyYAML lets the last one
win silently: ``backend: sim`` then ``backend: nccl`` would read as nccl). Non-goal: a general-purpose YAML
API; callers turn :class:`YamlLimitError` into their own errors.
"""

from __future__ import annotations

from typing import Any

import yaml

from topo_tune.errors import YamlLimitError

MAX_BYTES = 16 * 1024 * 1024
"""Largest text accepted (a cluster.yaml of tens of thousands of nodes stays far below)."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and sequences."""
MAX_NODES = 1_000_000
"""Most nodes the document may have once every alias is expanded."""


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:  # Any: the stubs' type for it is wrong
        node = super().compose_mapping_node(anchor)
        first: dict[tuple[str, str], yaml.Node] = {}
        for key, _value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue  # a mapping or list as a key: no cluster.yaml has one, and no two compare here
            earlier = first.setdefault((key.tag, key.value), key)
            if earlier is not key:
                raise yaml.constructor.ConstructorError(
                    problem=f"duplicate key {key.value!r} on lines {earlier.start_mark.line + 1} and "
                    f"{key.start_mark.line + 1}",
                    problem_mark=key.start_mark,
                )
        return node

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise YamlLimitError(
                    f"line {mark.line + 1}: nested more than {MAX_DEPTH} levels deep (mappings and lists)"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def expanded_size(root: yaml.Node, *, limit: int) -> int:
    """Nodes of ``root`` with every alias expanded, counted without expanding (stops past ``limit``)."""
    sizes: dict[int, int] = {}
    # Post-order walk with an explicit stack: the graph is a DAG (aliases point back to complete nodes).
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        size = 1 + sum(sizes[id(child)] for child in children)
        sizes[id(node)] = min(size, limit + 1)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load(text: str) -> Any:
    """The one document in ``text`` as Python objects, within the bounds; PyYAML's errors pass through."""
    if len(text) > MAX_BYTES:
        raise YamlLimitError(f"larger than {MAX_BYTES // (1024 * 1024)} MiB")
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        if expanded_size(root, limit=MAX_NODES) > MAX_NODES:
            raise YamlLimitError(f"more than {MAX_NODES} values once aliases are expanded (an alias bomb?)")
        return loader.construct_document(root)
    finally:
        loader.dispose()
