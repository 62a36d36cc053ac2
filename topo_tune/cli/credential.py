"""``topo-tune admin credential``: issue the narrower credentials (one node's agent, or the jobs), list them,
revoke one.

Needs the admin token. The token is printed alone on stdout, so it can go straight into a file or a Secret
and never through argv; list and revoke show ids (a short hash of each token), never a token.
"""

from __future__ import annotations

import click

from topo_tune.cli.admin import admin, connected
from topo_tune.cli.output import emit_data, emit_line, emit_table
from topo_tune.client.admin import AdminClient
from topo_tune.client.credential_entries import CredentialEntry, IssuedRole


@admin.group()
def credential() -> None:
    """Issue, list and revoke agent and job credentials (see docs/security.md for who holds which)."""


@credential.command()
@click.option("--node", "node_name", default="", metavar="NAME", help="An agent credential for this node only.")
@click.option("--job", "for_jobs", is_flag=True, help="A new job credential: `topo-tune env`/`exec` only.")
@click.option(
    "--scope",
    default="",
    metavar="PREFIX",
    help="With --job: act only for job ids starting with PREFIX (e.g. a Slurm job id, or a namespace's prefix).",
)
@connected
def issue(client: AdminClient, fmt: str, node_name: str, for_jobs: bool, scope: str) -> None:
    """Print a new credential's token.

    \b
    --node NAME  the agent of NAME: it may register as NAME and nothing else
    --job        a tenant's jobs: resolve their pinned config (topo-tune env / exec) and record their own
                 A/B (exec --compare), nothing else; each call issues a new credential, with its own id,
                 and what it pins or records is its own (no other job credential reads or extends it)

    \b
      topo-tune admin credential issue --node gpu-07 > gpu-07.token          # then: agent run --token-file
      topo-tune admin credential issue --job --scope team-a- > team-a.token   # TOPO_TUNE_TOKEN of team a
    """
    if bool(node_name) == for_jobs:
        raise click.UsageError("pass exactly one of --node NAME and --job")
    if scope and not for_jobs:
        raise click.UsageError("--scope is for --job credentials only")
    issued = client.issue_credential(IssuedRole.JOB if for_jobs else IssuedRole.AGENT, node_name, scope=scope)
    if fmt != "table":
        data = {"id": issued.id, "role": "job" if for_jobs else "agent", "node": node_name, "scope": scope}
        emit_data({**data, "token": issued.token}, fmt)
        return
    emit_line(issued.token)


def _row(entry: CredentialEntry) -> dict[str, str]:
    return {
        "id": entry.id,
        "role": entry.role,
        "node": entry.node_name,
        "scope": entry.scope,
        "issued": f"{entry.issued_at:%Y-%m-%dT%H:%M:%S}Z",
        "revoked": f"{entry.revoked_at:%Y-%m-%dT%H:%M:%S}Z" if entry.revoked_at is not None else "",
    }


@credential.command(name="list")
@connected
def list_(client: AdminClient, fmt: str) -> None:
    """The credentials issued, by id (never the token): role, node or job scope, when, and when revoked."""
    rows = [_row(c) for c in client.list_credentials()]
    if fmt != "table":
        emit_data(rows, fmt)
        return
    columns = ["id", "role", "node", "scope", "issued", "revoked"]
    emit_table("credentials", columns, [[r[c] for c in columns] for r in rows])


@credential.command()
@click.argument("credential_id", metavar="ID")
@connected
def revoke(client: AdminClient, fmt: str, credential_id: str) -> None:
    """Revoke credential ID (from `admin credential list`): refused from the next call on, and the node's open
    agent session is closed (the agent exits with status 2). A revoked job credential is replaced by issuing
    another (its jobs' pins stay with the revoked one); a node's revoked credential cannot be issued again:
    a new admin token gives every credential anew."""
    row = _row(client.revoke_credential(credential_id))
    if fmt != "table":
        emit_data(row, fmt)
        return
    emit_line(f"revoked {row['id']} ({row['role']}{', node ' + row['node'] if row['node'] else ''})")
