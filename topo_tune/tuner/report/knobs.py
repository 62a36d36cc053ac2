"""The knob-importance figure: which knobs set the best trials apart.

Purpose: Optuna's PED-ANOVA parameter importances over the completed search trials, drawn by Optuna's own
matplotlib visualization, in a stable knob order so two runs of one study give the same bytes.

Non-goals: choosing or judging knobs (the study and the proof do).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping

import matplotlib
import optuna
from optuna.importance import BaseImportanceEvaluator

matplotlib.use("Agg")  # files only: never a display; before pyplot is imported
from matplotlib.figure import Figure

from topo_tune.tuner.report.figure import FIG_W, ReportFigure, encode_png
from topo_tune.tuner.study import StudyOutcome


def knob_figure(outcome: StudyOutcome, label: str) -> ReportFigure | None:
    """Optuna's parameter-importance plot over the completed search trials: which knobs moved the speedup."""
    from optuna.importance import PedAnovaImportanceEvaluator  # noqa: PLC0415
    from optuna.visualization.matplotlib import plot_param_importances  # noqa: PLC0415

    done = [t for t in outcome.trials if t.state == "complete" and t.value is not None and not t.tuner_table]
    knobs = sorted({k for t in done for k in t.env} | {"rank_order"})
    values = {k: sorted({_knob_value(t.env, t.rank_order, k) for t in done}) for k in knobs}
    varied = [k for k in knobs if len(values[k]) > 1]
    if len(done) < 3 or not varied:
        return None
    dists: dict[str, optuna.distributions.BaseDistribution] = {
        k: optuna.distributions.CategoricalDistribution(values[k]) for k in varied
    }
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for t in done:
        assert t.value is not None
        study.add_trial(
            optuna.trial.create_trial(
                params={k: _knob_value(t.env, t.rank_order, k) for k in varied},
                distributions=dists,
                value=math.log(t.value),
            )
        )
    # Optuna switches matplotlib to its ggplot style sheet (globally): keep that to this one figure.
    with warnings.catch_warnings(), matplotlib.rc_context():
        # Optuna marks its matplotlib backend experimental and warns on every call.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = plot_param_importances(study, evaluator=_InNameOrder(PedAnovaImportanceEvaluator()))
        fig = ax.figure
        assert isinstance(fig, Figure)
        fig.set_size_inches(FIG_W, max(2.6, 0.3 * len(varied) + 1.3))
        ax.set_title("", loc="left")
        ax.set_title(f"knob importance [{label}]")
        ax.set_xlabel("importance for reaching the best trials")
        ax.set_ylabel("")
        legend = ax.get_legend()
        if legend is not None:
            legend.remove()
        png = encode_png(fig)
    caption = (
        f"Which knobs set the best trials apart, over the {len(done)} completed search trials: Optuna's "
        f"PED-ANOVA importances (a knob left unset counts as the value 'default'). [{label}]"
    )
    return ReportFigure("knobs.png", caption, png, "knobs")


class _InNameOrder(BaseImportanceEvaluator):
    """An evaluator's importances in knob-name order, rounded: PED-ANOVA returns them in an order that varies
    from process to process, which reorders knobs of equal importance (MIN_CTAS and MAX_CTAS, set together)
    and changes the figure's bytes between two runs of one study."""

    def __init__(self, inner: BaseImportanceEvaluator) -> None:
        self.inner = inner

    def evaluate(
        self, study: optuna.Study, params: list[str] | None = None, *, target: Callable[..., float] | None = None
    ) -> dict[str, float]:
        found = self.inner.evaluate(study, params, target=target)
        return {name: round(found[name], 12) for name in sorted(found)}


def _knob_value(env: Mapping[str, str], rank_order: str, knob: str) -> str:
    return rank_order if knob == "rank_order" else env.get(knob, "default")
