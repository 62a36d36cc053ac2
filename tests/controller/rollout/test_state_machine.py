"""The pure rollout state machine under random interleavings of agents, gates, lost nodes and operators.

A hypothesis state machine drives ``state.reconcile`` and the operator verbs against a model fleet (node →
active version) and checks after every step: waves after the current one are untouched, a node's phase
matches its wave's, final rollouts never move, and every step bumps the revision by one. At the end, a
rollback with a cooperative fleet always terminates with no node left on the new version.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from topo_tune.config.cluster import RolloutThresholdsConfig
from topo_tune.controller.rollout import state
from topo_tune.controller.rollout.gates import GateVerdict, Outcome
from topo_tune.controller.rollout.plan import PlanPolicy, build_plan
from topo_tune.controller.rollout.state import NodePhase, RolloutPhase, WavePhase
from topo_tune.errors import ConflictError

NEW, OLD = "cv-000000000000000b", "cv-000000000000000a"
RACK_OF = {f"r{r}n{n}": f"rack-{r}" for r in range(1, 4) for n in range(1, 3)}
START = datetime(2026, 1, 1, tzinfo=UTC)


class RolloutMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        policy = PlanPolicy(canary_nodes=1)
        step = state.new_snapshot(
            rollout_id="ro",
            config_version=NEW,
            previous_version=OLD,
            plan=build_plan(RACK_OF, policy),
            policy=policy,
            thresholds=RolloutThresholdsConfig(),
            created_by="test",
        )
        self.snapshot = step.snapshot
        self.fleet = dict.fromkeys(RACK_OF, OLD)
        self.lost: set[str] = set()
        self.verdicts: dict[tuple[int, int], GateVerdict] = {}
        self.now = START

    def _take(self, step: state.Step | None) -> None:
        if step is None:
            return
        assert step.snapshot.rollout.revision == self.snapshot.rollout.revision + 1
        assert step.audit, "every step says what changed"
        self.snapshot = step.snapshot

    def _observed(self) -> dict[str, state.Observed]:
        return {n: state.Observed(v, lost=n in self.lost) for n, v in self.fleet.items()}

    @rule()
    def reconcile(self) -> None:
        gate = state.pending_gate(self.snapshot)
        verdict = self.verdicts.get(gate) if gate else None
        before = self.snapshot.rollout.phase
        step = state.reconcile(self.snapshot, self._observed(), verdict, self.now)
        if before.final:
            assert step is None, "a final rollout never moves"
        self._take(step)

    @rule(data=st.data())
    def agents_apply(self, data: st.DataObject) -> None:
        desired = state.desired_versions(self.snapshot)
        reachable = sorted(n for n in desired if n not in self.lost)
        for node in data.draw(st.lists(st.sampled_from(reachable), unique=True)) if reachable else []:
            self.fleet[node] = desired[node]

    @rule(outcome=st.sampled_from(list(Outcome)))
    def gate_runs(self, outcome: Outcome) -> None:
        gate = state.pending_gate(self.snapshot)
        if gate is not None and gate not in self.verdicts:
            self.verdicts[gate] = GateVerdict(outcome, (f"simulated {outcome}",))

    @rule(node=st.sampled_from(sorted(RACK_OF)))
    def node_lost_or_back(self, node: str) -> None:
        self.lost ^= {node}

    @rule(verb=st.sampled_from(["pause", "resume", "promote", "abort", "rollback"]))
    def operator(self, verb: str) -> None:
        try:
            if verb == "pause":
                self._take(state.pause(self.snapshot, actor="op"))
            elif verb == "resume":
                self._take(state.resume(self.snapshot, actor="op"))
            elif verb == "promote":
                self._take(state.promote(self.snapshot, actor="op", now=self.now))
            elif verb == "abort":
                self._take(state.abort(self.snapshot, actor="op"))
            else:
                self._take(state.rollback(self.snapshot, actor="op"))
        except ConflictError:
            pass  # not allowed in this phase: refused without a change

    @rule()
    def time_passes(self) -> None:
        self.now += timedelta(minutes=5)

    @invariant()
    def waves_after_the_current_one_are_untouched(self) -> None:
        rollout = self.snapshot.rollout
        for wave in self.snapshot.waves:
            if wave.index > rollout.wave:
                assert wave.phase is WavePhase.PENDING, (wave, rollout)
            for node in wave.nodes:
                phase = self.snapshot.nodes[node].phase
                if wave.phase is WavePhase.PENDING:
                    assert phase is NodePhase.PENDING, (node, wave)
                if wave.phase is WavePhase.COMPLETED:
                    assert phase is NodePhase.APPLIED, (node, wave)
                if wave.phase is WavePhase.ROLLED_BACK:
                    assert phase in (NodePhase.ROLLED_BACK, NodePhase.PENDING), (node, wave)

    def teardown(self) -> None:
        """Whatever happened, a rollback with a cooperative fleet ends with nobody on the new version."""
        if self.snapshot.rollout.phase is RolloutPhase.COMPLETED:
            return
        self._take(state.rollback(self.snapshot, actor="op"))
        self.lost.clear()
        for _ in range(100):
            for node, version in state.desired_versions(self.snapshot).items():
                self.fleet[node] = version
            step = state.reconcile(self.snapshot, self._observed(), None, self.now)
            if step is None:
                break
            self._take(step)
        assert self.snapshot.rollout.phase is RolloutPhase.ROLLED_BACK
        assert set(self.fleet.values()) == {OLD}, self.fleet


RolloutMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_rollout_state_machine = RolloutMachine.TestCase
