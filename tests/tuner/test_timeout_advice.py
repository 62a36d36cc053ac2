"""Timeout advice: Gamma fit, 99.5th percentile, floor, PyTorch watchdog settings (no NCCL_TIMEOUT)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from topo_tune.errors import ConfigError
from topo_tune.tuner.timeout_advice import advise, fit_latency


def test_the_fit_recovers_the_99_5th_percentile_of_gamma_latencies() -> None:
    rng = np.random.default_rng(7)
    times = rng.gamma(shape=9.0, scale=50.0, size=4000).tolist()
    fit = fit_latency("all_reduce", times)
    assert fit.p995_us == pytest.approx(stats.gamma.ppf(0.995, 9.0, scale=50.0), rel=0.05)


def test_advice_scales_the_worst_collective_and_never_goes_below_the_floor() -> None:
    rng = np.random.default_rng(1)
    quick = {"all_reduce": rng.gamma(4.0, 100.0, 200).tolist()}  # ~1 ms
    advice = advise(quick, floor_s=300.0)
    assert advice.process_group_timeout_s == 300.0
    slow = {"all_reduce": rng.gamma(4.0, 100.0, 200).tolist(), "all_gather": rng.gamma(4.0, 1e5, 200).tolist()}
    big = advise(slow, floor_s=60.0, multiplier=1000.0)
    worst = max(f.p995_us for f in big.fits) * 1e-6 * 1000.0
    assert big.process_group_timeout_s >= worst and big.process_group_timeout_s % 60 == 0
    assert int(big.env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) > big.process_group_timeout_s
    assert not any(k.startswith("NCCL_") for k in big.env), "there is no NCCL_TIMEOUT"
    assert "no NCCL_TIMEOUT" in str(big.to_json()["note"])


def test_too_few_or_bad_samples_name_the_collective() -> None:
    with pytest.raises(ConfigError, match=r"latencies.all_reduce"):
        fit_latency("all_reduce", [1.0, 2.0])
    with pytest.raises(ConfigError, match=r"latencies.broadcast"):
        fit_latency("broadcast", [1.0, 2.0, 3.0, 4.0, -1.0])
