"""The docs' table of every variable topo-tune knows (``docs/nccl-variables.md``), rendered from the catalogue.

``python tools/gen_docs.py`` writes it; a test fails when the committed page differs from what this renders.
Non-goal: explaining the roles beyond a line each (``catalogue.py`` and ``docs/tuner.md`` do).
"""

from __future__ import annotations

from topo_tune.nccl.variables import Catalogue, VariableRole

_ROLE_TEXT = {
    VariableRole.SEARCHED: "searched by studies",
    VariableRole.TUNABLE: "a job or version may set it; studies leave it to NCCL",
    VariableRole.SITE: "fixed once per fabric (`siteFixed`), passed into every trial and output",
    VariableRole.FORBIDDEN: "never searched; only the values listed are accepted",
    VariableRole.MANAGED: "set by topo-tune from the job's config version",
    VariableRole.DEBUG: "debugging, dumps and PyTorch's watchdog",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(catalogue: Catalogue) -> str:
    dimension_of = {name: d.name for d in catalogue.dimensions for name in d.variables}
    lines = [
        "# NCCL and torch variables topo-tune knows",
        "",
        "<!-- Generated from topo_tune/nccl/variables.py by `python tools/gen_docs.py`; do not edit. -->",
        "",
        "A job or config version may set exactly these variables, each to a value of its type; any other name",
        "is refused with the reason (`docs/security.md`). Roles:",
        "",
        *(f"- **{role.value}**: {text}" for role, text in _ROLE_TEXT.items()),
        "",
        "| variable | role | values | search dimension | backends | why | never searched because |",
        "|---|---|---|---|---|---|---|",
    ]
    for role in VariableRole:
        for var in catalogue.with_role(role):
            lines.append(
                f"| `{var.name}` | {role.value} | {_cell(var.type.describe())} | {dimension_of.get(var.name, '')} "
                f"| {', '.join(var.backends)} | {_cell(var.why)} | {_cell(var.hazard)} |"
            )
    return "\n".join(lines) + "\n"
