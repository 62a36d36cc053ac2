"""``topo-tune admin credential``: issue the narrower credentials (one node's agent, or the jobs).

Needs the admin token. The token is printed alone on stdout, so it can go straight into a file or a Secret
and never through argv.
"""

from __future__ import annotations

import click

from topo_tune.cli.admin import admin, connected
from topo_tune.cli.output import emit_data
from topo_tune.client import AdminClient
from topo_tune.v1 import admin_pb2


@admin.group()
def credential() -> None:
    """Issue agent and job credentials (see docs/security.md for who holds which)."""


@credential.command()
@click.option("--node", "node_name", default="", metavar="NAME", help="An agent credential for this node only.")
@click.option("--job", "for_jobs", is_flag=True, help="The job credential: `topo-tune env`/`exec` only.")
@connected
def issue(client: AdminClient, fmt: str, node_name: str, for_jobs: bool) -> None:
    """Print a new credential's token.

    \b
    --node NAME  the agent of NAME: it may register as NAME and nothing else
    --job        jobs: resolve their pinned config (topo-tune env / exec) and record their own A/B
                 (exec --compare), nothing else

    \b
      topo-tune admin credential issue --node gpu-07 > gpu-07.token   # then: agent run --token-file
      topo-tune admin credential issue --job > job.token               # for TOPO_TUNE_TOKEN of job users
    """
    if bool(node_name) == for_jobs:
        raise click.UsageError("pass exactly one of --node NAME and --job")
    role = admin_pb2.CREDENTIAL_ROLE_JOB if for_jobs else admin_pb2.CREDENTIAL_ROLE_AGENT
    issued = client.issue_credential(role, node_name)
    if fmt != "table":
        emit_data({"role": "job" if for_jobs else "agent", "node": node_name, "token": issued.token}, fmt)
        return
    click.echo(issued.token)
