"""What the chart hands to topo-tune is accepted by topo-tune itself.

The rendered container args are parsed by the real `topo-tune` click commands (an unknown or misspelt flag
fails here, not in a CrashLoopBackOff), the environment variables the chart sets are ones those commands
read, and the rendered cluster.yaml passes the real cluster.yaml loader.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from unittest import mock

import click
import pytest

from tests.deploy.chart_render import Manifest, Rendered, ci_values, containers, env_of, render
from topo_tune.cli.connection import TOKEN_ENVVAR
from topo_tune.cli.main import cli
from topo_tune.config.cluster import loads_cluster_config
from topo_tune.controller.serving import SERVICE_NAMES
from topo_tune.errors import ConfigError

OPTION_SETS = {"default": {}, **ci_values(), "fixed-rack": {"agent": {"rack": "rack-07"}}}
# Read by the NVIDIA container runtime, not by topo-tune.
RUNTIME_ENV = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
# What an env entry with valueFrom (Secret, downward API) resolves to while the args are parsed here.
FROM_CLUSTER = "<valueFrom>"


@pytest.fixture(scope="module", params=sorted(OPTION_SETS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return render(OPTION_SETS[request.param])


def _command_context(args: list[str], env: Mapping[str, str] | None = None) -> click.Context:
    """Parse `topo-tune ARGS` down to the leaf command, as click does before running it (nothing runs).

    ``env`` is the container's environment: options read their environment variables from it, and from
    nothing else (the test process's own TOPO_TUNE_* variables are hidden).
    """
    command: click.Command = cli
    name, parent, remaining = "topo-tune", None, list(args)
    with mock.patch.dict(os.environ):
        for key in [key for key in os.environ if key.startswith("TOPO_TUNE_")]:
            del os.environ[key]
        os.environ.update(env or {})
        while True:
            context = command.context_class(command, info_name=name, parent=parent, **command.context_settings)
            # The base class's parse_args: a group's own would stash the sub-command in private fields.
            remaining = click.Command.parse_args(command, context, remaining)
            if not isinstance(command, click.Group):
                return context
            sub_name, sub, remaining = command.resolve_command(context, remaining)
            assert sub is not None and sub_name is not None
            command, name, parent = sub, sub_name, context


def _envvars(context: click.Context | None) -> set[str]:
    """Environment variables read by the command and the groups above it."""
    names: set[str] = set()
    while context is not None:
        for param in context.command.params:
            envvar = getattr(param, "envvar", None)
            names |= {envvar} if isinstance(envvar, str) else set(envvar or ())
            if param.name == "token_file":
                names.add(TOKEN_ENVVAR)  # the token's fallback: read by resolve_token, not a flag of its own
        context = context.parent
    return names


def _check_container(container: Manifest) -> click.Context:
    env = {name: entry.get("value", FROM_CLUSTER) for name, entry in env_of(container).items()}
    try:
        context = _command_context(container["args"], env)
    except click.UsageError as error:
        pytest.fail(f"topo-tune rejects the chart's args {container['args']} with env {env}: {error.format_message()}")
    # Every variable the chart sets is read by the command it starts, except the container runtime's.
    unread = set(env) - RUNTIME_ENV - _envvars(context)
    assert unread == set(), f"{context.command_path} does not read {sorted(unread)}"
    return context


def test_controller_args_and_env_are_topo_tunes(rendered: Rendered) -> None:
    (container,) = containers(rendered.controller)
    context = _check_container(container)
    assert context.command_path == "topo-tune controller serve"
    assert context.params["config_file"] is not None
    # Several replicas elect a leader on a Lease of their own release, in the pod's namespace.
    several = rendered.controller["spec"]["replicas"] > 1
    assert context.params["leader_election"] is several
    if several:
        assert context.params["lease_name"] == rendered.controller["metadata"]["name"]
        assert context.params["lease_namespace"] == FROM_CLUSTER
        assert context.params["pod_name"] == FROM_CLUSTER  # labelled while it leads


def test_controller_probes_ask_for_health_services_the_controller_reports(rendered: Rendered) -> None:
    (container,) = containers(rendered.controller)
    # Liveness: the process, SERVING on a standby too. Readiness: one replica, the agent service (SERVING once
    # the state is loaded); several, the process, and the Service selects the leader by its pod label.
    assert container["livenessProbe"]["grpc"].get("service", "") == ""
    readiness = container["readinessProbe"]["grpc"].get("service", "")
    several = rendered.controller["spec"]["replicas"] > 1
    assert readiness == "" if several else readiness in SERVICE_NAMES


def test_agent_args_and_env_are_topo_tunes(rendered: Rendered) -> None:
    (container,) = containers(rendered.agent)
    context = _check_container(container)
    assert context.command_path == "topo-tune agent run"
    assert context.params["backend"] == "nccl"
    assert context.params["node_name"] == FROM_CLUSTER  # the downward API's spec.nodeName
    # The rack: a fixed value, else the named label of the agent's Node.
    env = env_of(container)
    assert context.params["rack"] == env.get("TOPO_TUNE_RACK", {}).get("value", "")
    if "TOPO_TUNE_RACK_LABEL" in env:
        assert context.params["rack_label"] == env["TOPO_TUNE_RACK_LABEL"]["value"]


def test_helm_test_args_and_env_are_topo_tunes(rendered: Rendered) -> None:
    (container,) = containers(rendered.test_pod)
    context = _check_container(container)
    assert context.command_path == "topo-tune admin nodes"
    assert context.params["fmt"] == "json"


def test_rendered_cluster_yaml_is_accepted_by_topo_tune(rendered: Rendered) -> None:
    (configmap,) = rendered.all("ConfigMap")
    cluster = loads_cluster_config(configmap["data"]["cluster.yaml"])
    (agent,) = containers(rendered.agent)
    assert cluster.backend == _command_context(agent["args"]).params["backend"]
    label = env_of(agent).get("TOPO_TUNE_RACK_LABEL")
    if label is not None:
        assert cluster.rack_label == label["value"]


def test_cluster_config_from_values_reaches_the_loader() -> None:
    values = {
        "clusterConfig": {
            "apiVersion": "topo-tune/v1",
            "controller": {"heartbeatInterval": "5s", "heartbeatExpiry": "20s"},
            "racks": [{"name": "rack-a", "nodes": [{"name": "gpu-a1", "gpus": 8}]}],
        }
    }
    (configmap,) = render(values).all("ConfigMap")
    cluster = loads_cluster_config(configmap["data"]["cluster.yaml"])
    assert cluster.rack_of() == {"gpu-a1": "rack-a"}
    assert cluster.controller.heartbeat_interval == 5.0
    assert cluster.metadata.name == "tt"

    (bad,) = render({"clusterConfig": {"apiVersion": "topo-tune/v1", "racks": [{"name": "r"}]}}).all("ConfigMap")
    with pytest.raises(ConfigError, match=r"racks\[0\]\.nodes"):
        loads_cluster_config(bad["data"]["cluster.yaml"])
