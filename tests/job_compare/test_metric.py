"""The metric of a run: the last match of --metric in its output, group 1, a positive finite float."""

from __future__ import annotations

import pytest

from topo_tune.errors import ConfigError, MetricNotFound
from topo_tune.jobs.compare.metric import MetricReader, compile_metric, parse_metric

OUTPUT = """warming up
step 1 step_time=0.91 loss=2.3
step 2 step_time=0.52 loss=2.1
step 3 step_time=0.50 loss=2.0
done: mean step_time=0.505
"""


def test_the_last_match_of_group_one_is_the_value() -> None:
    assert parse_metric(compile_metric(r"step_time=([0-9.]+)"), OUTPUT, run="run 1") == 0.505
    assert parse_metric(compile_metric(r"loss=(\d+\.\d+)"), OUTPUT, run="run 1") == 2.0


def test_the_streaming_reader_agrees_with_the_whole_output() -> None:
    reader = MetricReader(compile_metric(r"step_time=([0-9.]+)"))
    for line in OUTPUT.splitlines():
        reader.feed(line)
    assert reader.value("run 1") == 0.505


def test_several_matches_on_one_line_take_the_last_and_numbers_may_use_exponents() -> None:
    pattern = compile_metric(r"t=(\S+)")
    assert parse_metric(pattern, "t=1 t=2.5e-3\n", run="run 1") == 0.0025


@pytest.mark.parametrize(
    ("regex", "reason"),
    [("step_time=([0-9.]+", "not a valid regular expression"), ("step_time=[0-9.]+", "needs a group"), ("", "give")],
)
def test_a_bad_regex_names_the_flag(regex: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=f"^--metric: {reason}"):
        compile_metric(regex)


def test_no_match_names_the_run_and_the_pattern() -> None:
    with pytest.raises(
        MetricNotFound, match=r"^run 3 \(candidate, pair 2\) printed nothing matching --metric 'tput=\(\\d\+\)'"
    ):
        parse_metric(compile_metric(r"tput=(\d+)"), OUTPUT, run="run 3 (candidate, pair 2)")


@pytest.mark.parametrize(
    ("text", "reason"), [("t=abc", "not a number"), ("t=0", "> 0"), ("t=nan", "> 0"), ("t=-1", "> 0")]
)
def test_a_value_that_is_no_positive_number_is_refused(text: str, reason: str) -> None:
    with pytest.raises(MetricNotFound, match=f"^run 1.*{reason}"):
        parse_metric(compile_metric(r"t=(\S+)"), text, run="run 1")
