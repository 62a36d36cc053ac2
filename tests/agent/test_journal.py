"""The agent's journal stays bounded: results the controller acknowledged are pruned past the newest N, while
running commands and results still waiting for delivery are never dropped."""

from __future__ import annotations

from pathlib import Path

from topo_tune.agent.journal import Entry, Journal
from topo_tune.v1 import agent_pb2


def _finish(journal: Journal, command_id: str) -> None:
    assert journal.take(command_id).entry is Entry.NEW
    journal.finish(agent_pb2.CommandResult(command_id=command_id, status=agent_pb2.COMMAND_STATUS_SUCCEEDED))


def test_acknowledged_rows_are_pruned_past_the_bound(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite3", keep_delivered=3)
    journal.take("running")
    _finish(journal, "waiting")  # finished, not yet acknowledged
    for i in range(10):
        _finish(journal, f"c{i}")
        journal.delivered(f"c{i}")
    assert journal.command_ids() == ["running", "waiting", "c7", "c8", "c9"]
    assert [r.command_id for r in journal.undelivered()] == ["waiting"]
    assert journal.interrupted() == ["running"]
    assert journal.take("c9").entry is Entry.DONE, "a kept command is still never run twice"
    journal.close()


def test_the_bound_holds_across_repeated_acknowledgements_and_a_reopened_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path, keep_delivered=3)
    for i in range(3):
        _finish(journal, f"c{i}")
        journal.delivered(f"c{i}")
        journal.delivered(f"c{i}")  # the controller acknowledged a re-sent result again
    journal.delivered("never-taken")
    assert journal.command_ids() == ["c0", "c1", "c2"], "a repeated or unknown acknowledgement prunes nothing"
    journal.close()
    reopened = Journal(path, keep_delivered=3)  # an agent restarted on the same state
    _finish(reopened, "c3")
    reopened.delivered("c3")
    assert reopened.command_ids() == ["c1", "c2", "c3"]
    reopened.close()
