"""Text an agent or a job chose is inert wherever a person reads it: every admin table and listing, and the report.

A real controller (gRPC on loopback) and agents' sessions that register and report hostile values in every field
they control: markup that rich would parse (``[/x]`` crashed ``admin nodes`` fleet-wide, ``[link=…]`` made a live
hyperlink), ESC[2J, OSC 8 links, OSC 0 titles, U+202E, NUL and 10 kB. A registration's fields take printable
text only (``test_registration_fields``), so they carry the markup; the free-text fields (a heartbeat's config
damage, a command's result, a job's metric) carry everything. The admin commands run through the CLI's own
entry point against that controller, and what they print must hold no raw control or bidirectional character,
show markup as the characters it is, stay bounded, and exit 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import grpc
import grpc.aio
import pytest
from click.testing import CliRunner, Result
from sqlalchemy.orm import Session

from tests.controller.test_job_comparisons import _job_client, _pin_arms, _request
from tests.controller.test_registration_fields import recorded
from tests.controller.test_services import open_session, register
from tests.support.processes import TOKEN
from tests.test_table_text import _RAW, HOSTILE
from tools.report_browser import Chromium, chromium_binary
from topo_tune.cli.main import cli
from topo_tune.controller.db.models import ProbeRoundRow
from topo_tune.controller.server import Controller
from topo_tune.jobs.compare.schedule import Arm
from topo_tune.security.auth import bearer_metadata
from topo_tune.tuner.report.job_comparisons import comparison_section
from topo_tune.v1 import admin_pb2, admin_pb2_grpc, agent_pb2

HUGE = "h" * 10_000
FREE_TEXT = [*HOSTILE, HUGE]
"""One node per value: its heartbeat's config damage and its command's result message."""
MARKUP = [text for text in HOSTILE if not _RAW.search(text) and "\n" not in text]
"""What a registration's printable fields can carry: markup, no control character."""
AgentCall = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ControllerMessage]


async def _hostile_node(channel: grpc.aio.Channel, index: int) -> AgentCall:
    """Node ``n{index}``: registered with markup in every printable field, then config damage and a command's
    result message of ``FREE_TEXT[index]``."""
    markup = MARKUP[index % len(MARKUP)]
    topo = recorded()
    topo.gpus[0].name = markup
    topo.unknowns.append(markup)
    topo.versions.nccl = markup[:128]
    labels = {"note": markup, "topology.kubernetes.io/zone": MARKUP[-1]}
    call = await open_session(channel, register(f"n{index}", agent_version=markup[:64], labels=labels, topology=topo))
    assert (await asyncio.wait_for(call.read(), 10)).registered.node_name == f"n{index}"
    await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1, config_damage=FREE_TEXT[index])))
    assert (await asyncio.wait_for(call.read(), 10)).heartbeat_ack.seq == 1
    rediscover = agent_pb2.Rediscover()
    send = admin_pb2.SendCommandRequest(node_name=f"n{index}", command_id=f"c{index}", rediscover=rediscover)
    await admin_pb2_grpc.AdminServiceStub(channel).SendCommand(send, metadata=bearer_metadata(TOKEN), timeout=10)
    assert (await asyncio.wait_for(call.read(), 10)).command.command_id == f"c{index}"
    done = agent_pb2.CommandResult(
        command_id=f"c{index}", status=agent_pb2.COMMAND_STATUS_FAILED, message=FREE_TEXT[index]
    )
    await call.write(agent_pb2.AgentMessage(result=done))
    assert (await asyncio.wait_for(call.read(), 10)).result_ack.command_id == f"c{index}"
    return call


@pytest.fixture
async def hostile_fleet(controller: Controller) -> AsyncIterator[Controller]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
        sessions = [await _hostile_node(channel, i) for i in range(len(FREE_TEXT))]
        yield controller
        for call in sessions:
            call.cancel()


async def _admin(controller: Controller, *args: str) -> Result:
    """``topo-tune admin ARGS`` through the CLI's entry point, in a thread (the controller serves in this loop)."""
    argv = ["admin", *args, "--controller", f"127.0.0.1:{controller.port}"]
    return await asyncio.to_thread(
        CliRunner().invoke, cli, argv, env={"TOPO_TUNE_TOKEN": TOKEN, "COLUMNS": "200"}, catch_exceptions=False
    )


def _inert(result: Result, command: Sequence[str]) -> str:
    shown = result.output
    assert result.exit_code == 0, f"{command}: {shown[-3000:]}"
    assert "Traceback" not in shown and "MarkupError" not in shown, command
    raw = _RAW.search(shown)
    assert raw is None, f"{command} printed {raw.group()!r} raw" if raw else ""
    assert "\x1b" not in shown and "\u202e" not in shown, command
    return shown


async def test_every_admin_table_shows_agent_text_inert(hostile_fleet: Controller) -> None:
    controller = hostile_fleet
    listed = _inert(await _admin(controller, "nodes"), ["nodes"])
    assert all(f"n{i}" in listed for i in range(len(FREE_TEXT)))
    commands = _inert(await _admin(controller, "commands"), ["commands"])
    for i, text in enumerate(FREE_TEXT):
        node = _inert(await _admin(controller, "node", f"n{i}"), ["node", f"n{i}"])
        command = _inert(await _admin(controller, "command", f"c{i}"), ["command", f"c{i}"])
        markup = MARKUP[i % len(MARKUP)]
        assert markup in node, "markup in a registered field is shown as the characters it is"
        if text is HUGE:
            assert "(10000 characters in all)" in node and "(10000 characters in all)" in command
            assert len(command) < 4000, "a 10 kB result is cut in a cell"
        elif text in MARKUP:
            assert text in node and text in command and text in commands
        if text == "line\nforged second line":
            assert "line\\nforged second line" in command, "a newline is shown as its escape, on its row"
    assert "\\x1b[2J" in commands and "\\u202e" in commands and "\\x00" in commands
    _inert(await _admin(controller, "topology"), ["topology"])
    matrix = _inert(await _admin(controller, "topology", "n0"), ["topology", "n0"])
    assert MARKUP[0] in matrix, "the GPU name and what discovery could not tell, as the characters they are"
    # The scripting formats escape by construction and carry every value whole.
    as_json = _inert(await _admin(controller, "node", f"n{FREE_TEXT.index(HUGE)}", "-o", "json"), ["node", "json"])
    assert HUGE in as_json


async def test_a_job_s_metric_is_inert_in_the_listing_and_escaped_in_the_report(
    controller: Controller, tmp_path: Path
) -> None:
    metric = " ".join(text for text in HOSTILE if "\n" not in text) + " <script>alert(1)</script> <a href=x>y</a>"

    def record() -> None:
        _pin_arms(controller)
        with _job_client(controller) as client:
            for arm in (Arm.AGAINST, Arm.CANDIDATE):
                client.record_job_comparison(*_request(arm, metric=metric))

    await asyncio.to_thread(record)
    listing = _inert(await _admin(controller, "job", "comparisons"), ["job", "comparisons"])
    assert "train-77" in listing and "faster" in listing

    report = tmp_path / "report.html"
    report.write_text(f"<html><body><h1>init's page</h1>{comparison_section([])}</body></html>", encoding="utf-8")
    refreshed = await _admin(controller, "job", "comparisons", "--report", str(report))
    _inert(refreshed, ["job", "comparisons", "--report"])
    page = report.read_text(encoding="utf-8")
    assert "<script>" not in page and "<a href" not in page and "&lt;script&gt;" in page
    assert chromium_binary() is not None, "the report test needs Debian's chromium (make chromium installs it)"
    with Chromium() as browser:
        browser.open(report)
        elements = browser.evaluate("Array.from(document.querySelectorAll('script,a,iframe')).length")
        text = browser.evaluate("document.getElementById('jobs').parentElement.innerText")
    assert elements == 0, "the metric made no element of the page"
    assert "[link=https://attacker.invalid]click[/link]" in text and "<script>alert(1)</script>" in text


async def test_a_stored_message_is_one_inert_line(controller: Controller) -> None:
    """A value the controller stored and answers (here a probe round's message, forged in its database) is printed
    as one escaped line: no escape sequence, no line of its own."""
    forged = "\x1b]0;forged title\x07\x1b[2J[/x]\n# probe round pr-1: succeeded \u202e"

    def forge(session: Session) -> None:
        at = datetime(2026, 12, 1, tzinfo=UTC)
        session.add(
            ProbeRoundRow(
                id="pr-forged",
                status="failed",
                message=forged,
                nodes=["n0", "n1"],
                message_bytes=1 << 20,
                created_at=at,
                finished_at=at,
            )
        )

    await controller.db.run(forge)
    shown = _inert(await _admin(controller, "probe", "show", "pr-forged"), ["probe", "show"])
    assert "# \\x1b]0;forged title\\x07\\x1b[2J[/x]\\n# probe round pr-1: succeeded \\u202e\n" in shown
    assert not any(line.startswith("# probe round pr-1") for line in shown.splitlines())
