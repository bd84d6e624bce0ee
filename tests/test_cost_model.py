"""The spot-vs-on-demand cost model of ``make bench`` (benchmarks/cost_model.py): properties, not numbers."""

from __future__ import annotations

import math
import re
from itertools import pairwise

import pytest

from benchmarks.cost_model import ADVISOR_BUCKETS, expected_job_cost, mtbi_h, young_daly_s

RATES = [0.0, 0.01, 0.025, 0.075, 0.125, 0.175, 0.25, 0.4]
MEASURED = {"checkpoint_cost_s": 12.0, "restart_s": 20.0}


def test_no_interruptions_and_no_discount_cost_exactly_on_demand() -> None:
    job = expected_job_cost(monthly_rate=0.0, discount=0.0, **MEASURED)
    assert job.cost_vs_on_demand == 1.0
    assert job.interruptions == 0.0
    assert job.break_even_discount == 0.0


@pytest.mark.parametrize("emergency", [None, 3.0])
def test_at_zero_discount_spot_never_beats_on_demand(emergency: float | None) -> None:
    for rate in RATES:
        job = expected_job_cost(monthly_rate=rate, discount=0.0, emergency_checkpoint_s=emergency, **MEASURED)
        assert job.cost_vs_on_demand >= 1.0
        assert job.paid_h >= 24.0


@pytest.mark.parametrize("emergency", [None, 3.0])
def test_cost_grows_with_the_interruption_rate(emergency: float | None) -> None:
    costs = [
        expected_job_cost(monthly_rate=r, discount=0.7, emergency_checkpoint_s=emergency, **MEASURED) for r in RATES
    ]
    assert all(a.cost_vs_on_demand < b.cost_vs_on_demand for a, b in pairwise(costs))
    assert all(a.interruptions < b.interruptions for a, b in pairwise(costs))
    assert all(a.interval_s > b.interval_s for a, b in pairwise(costs[1:]))  # checkpoint more often


def test_cost_grows_with_checkpoint_cost_and_restart_time() -> None:
    base = expected_job_cost(monthly_rate=0.125, discount=0.7, **MEASURED)
    slower_ckpt = expected_job_cost(monthly_rate=0.125, discount=0.7, checkpoint_cost_s=60.0, restart_s=20.0)
    slower_restart = expected_job_cost(monthly_rate=0.125, discount=0.7, checkpoint_cost_s=12.0, restart_s=600.0)
    assert slower_ckpt.cost_vs_on_demand > base.cost_vs_on_demand
    assert slower_restart.cost_vs_on_demand > base.cost_vs_on_demand


def test_cost_is_proportional_to_the_spot_price() -> None:
    """Cost / (1 - discount) does not depend on the discount; more discount, lower cost."""
    discounts = (0.0, 0.3, 0.6, 0.9)
    jobs = [expected_job_cost(monthly_rate=0.175, discount=d, **MEASURED) for d in discounts]
    per_price = [j.cost_vs_on_demand / (1 - d) for j, d in zip(jobs, discounts, strict=True)]
    assert max(per_price) == pytest.approx(min(per_price))
    assert all(a.cost_vs_on_demand > b.cost_vs_on_demand for a, b in pairwise(jobs))


@pytest.mark.parametrize("rate", [0.025, 0.175, 0.25])
def test_at_the_break_even_discount_spot_costs_what_on_demand_costs(rate: float) -> None:
    even = expected_job_cost(monthly_rate=rate, discount=0.0, **MEASURED).break_even_discount
    assert 0.0 < even < 1.0
    assert expected_job_cost(monthly_rate=rate, discount=even, **MEASURED).cost_vs_on_demand == pytest.approx(1.0)


def test_honouring_the_notice_is_cheaper_when_the_emergency_checkpoint_is_shorter_than_half_an_interval() -> None:
    for rate in RATES[1:]:
        missed = expected_job_cost(monthly_rate=rate, discount=0.7, **MEASURED)
        honoured = expected_job_cost(
            monthly_rate=rate, discount=0.7, emergency_checkpoint_s=missed.interval_s / 4, **MEASURED
        )
        assert honoured.cost_vs_on_demand < missed.cost_vs_on_demand


def test_mtbi_falls_as_the_monthly_rate_rises_and_matches_the_poisson_reading() -> None:
    rates = [0.0, *(r for _, r in ADVISOR_BUCKETS)]
    values = [mtbi_h(r) for r in rates]
    assert math.isinf(values[0])
    assert all(a > b for a, b in pairwise(values))
    # P(no interruption in a month) = exp(-720 h / MTBI) = 1 - p
    for rate in rates[1:]:
        assert math.exp(-720.0 / mtbi_h(rate)) == pytest.approx(1.0 - rate)


def test_young_daly_interval_minimises_first_order_overhead() -> None:
    cost_s, mtbi_s = 30.0, 50 * 3600.0
    best = young_daly_s(cost_s, mtbi_s)

    def overhead(tau: float) -> float:
        return cost_s / tau + tau / (2 * mtbi_s)

    assert overhead(best) < overhead(best * 0.9)
    assert overhead(best) < overhead(best * 1.1)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("monthly interruption rate must be in [0, 1), not 1.0")):
        mtbi_h(1.0)
    with pytest.raises(ValueError, match=re.escape("discount must be in [0, 1], not 1.5")):
        expected_job_cost(monthly_rate=0.1, discount=1.5, **MEASURED)
    with pytest.raises(ValueError, match=r"^work_h must be positive; checkpoint_cost_s and restart_s not negative$"):
        expected_job_cost(monthly_rate=0.1, discount=0.5, checkpoint_cost_s=-1.0, restart_s=20.0)
    # a restart longer than the time between interruptions never finishes
    too_long = f"an interruption costs more than the mean time between interruptions ({mtbi_h(0.99):.2f} h)"
    with pytest.raises(ValueError, match=re.escape(too_long)):
        expected_job_cost(monthly_rate=0.99, discount=0.5, checkpoint_cost_s=10.0, restart_s=10 * 24 * 3600.0)
