"""Which job ends before its deadline, and the message and cancel commands it ends with."""

from __future__ import annotations

from topo_tune.controller.job_ends import OpenPart, cancel_command, cancel_command_id, why_it_cannot_finish
from topo_tune.v1 import agent_pb2


def _result(status: agent_pb2.CommandStatus.ValueType, message: str = "", *ranks: agent_pb2.RankStatus) -> OpenPart:
    result = agent_pb2.CommandResult(status=status, message=message)
    result.node_benchmark.rank_status.extend(ranks)
    return OpenPart("b", True, result)


def _failed_rank(rank: int, message: str) -> agent_pb2.RankStatus:
    return agent_pb2.RankStatus(rank=rank, outcome=agent_pb2.RANK_OUTCOME_FAILED, message=message)


def test_a_job_that_can_still_finish_goes_on() -> None:
    parts = [_result(agent_pb2.COMMAND_STATUS_SUCCEEDED), OpenPart("a", False, None)]
    assert why_it_cannot_finish(parts, lost=()) == ""
    assert why_it_cannot_finish(parts, lost=("b",)) == "", "a node lost after its result is in costs nothing"


def test_a_part_timed_out_is_left_to_the_shared_deadline() -> None:
    parts = [_result(agent_pb2.COMMAND_STATUS_TIMED_OUT, "ranks [1] killed"), OpenPart("a", False, None)]
    assert why_it_cannot_finish(parts, lost=()) == ""


def test_a_failed_rank_is_named_not_the_ranks_killed_for_it() -> None:
    part = _result(
        agent_pb2.COMMAND_STATUS_FAILED,
        "job j failed: ...",
        _failed_rank(2, "killed because another local rank failed"),
        _failed_rank(3, "RuntimeError: Cannot resolve 192.0.2.1"),
    )
    assert why_it_cannot_finish([part], lost=()) == "node b rank 3 failed: RuntimeError: Cannot resolve 192.0.2.1"


def test_a_refused_part_ends_the_job_with_the_nodes_reason() -> None:
    part = _result(agent_pb2.COMMAND_STATUS_REJECTED, "node is drained: it takes no benchmark work")
    assert why_it_cannot_finish([part], lost=()) == "node b rejected: node is drained: it takes no benchmark work"


def test_lost_nodes_that_have_not_reported_end_the_job() -> None:
    parts = [OpenPart("c", False, None), OpenPart("a", False, None), OpenPart("d", False, None)]
    assert why_it_cannot_finish(parts, lost=("c", "a")) == "nodes a, c lost (no heartbeat) while the job ran"
    assert why_it_cannot_finish(parts, lost=("d",)) == "node d lost (no heartbeat) while the job ran"


def test_cancel_ids_are_stable_and_fit_the_command_id_column() -> None:
    assert cancel_command_id("gate-0123", 2) == "gate-0123-cancel-2"
    long = "j" * 64
    assert cancel_command_id(long, 10) == cancel_command_id(long, 10)
    assert cancel_command_id(long, 10) != cancel_command_id(long, 1)
    assert len(cancel_command_id(long, 10)) <= 64
    command = cancel_command("gate-0123", "node a lost")
    assert command.cancel_job == agent_pb2.CancelJob(job_id="gate-0123", reason="node a lost")
