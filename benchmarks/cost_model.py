"""Expected cost of a training job on spot vs on-demand, from the interruption rate and measured checkpoint times.

Pure functions (no I/O), used by ``benchmarks/notice_report.py`` and unit-tested in ``tests/test_cost_model.py``.

The model (first order, the one Young's interval is derived from), for a job that needs ``work_h`` hours of
training on one instance:

* interruptions arrive as a Poisson process. The Spot Instance Advisor's "frequency of interruption" is the share
  of a pool's capacity reclaimed during the trailing month; read as the chance ``p`` that an instance is interrupted
  within a month (30 days), the rate is ``lambda = -ln(1 - p) / 720 h`` and the mean time between interruptions
  ``M = 1 / lambda``;
* a checkpoint costs ``C`` seconds and is taken every ``tau = sqrt(2 C M)`` seconds of work (Young/Daly);
* each interruption costs the work since the last checkpoint (``tau / 2`` on average, when the notice is not used)
  or the emergency checkpoint (``E``, when the 120 s notice is honoured), plus the restart ``R``;
* so the paid instance time ``T`` solves ``T = W (1 + C / tau) + (T / M) (lost + R)``:
  ``T = W (1 + C / tau) / (1 - (lost + R) / M)``;
* spot cost / on-demand cost = ``(1 - discount) T / W`` (on-demand: ``W`` hours, no checkpoints, no interruptions).
  Spot pays off while the discount exceeds ``1 - W / T`` (the break-even discount).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

MONTH_H = 30 * 24.0
# Spot Instance Advisor buckets (share of capacity reclaimed in the trailing month): label, rate used (midpoint;
# the open-ended ">20%" bucket is evaluated at 25%).
ADVISOR_BUCKETS: tuple[tuple[str, float], ...] = (
    ("<5%", 0.025),
    ("5-10%", 0.075),
    ("10-15%", 0.125),
    ("15-20%", 0.175),
    (">20%", 0.25),
)


def mtbi_h(monthly_rate: float) -> float:
    """Mean time between interruptions (hours) of an instance interrupted with probability ``monthly_rate`` a month."""
    if not 0.0 <= monthly_rate < 1.0:
        raise ValueError(f"monthly interruption rate must be in [0, 1), not {monthly_rate}")
    if monthly_rate == 0.0:
        return math.inf
    return MONTH_H / -math.log1p(-monthly_rate)


def young_daly_s(checkpoint_cost_s: float, mtbi_s: float) -> float:
    """Checkpoint interval minimising expected overhead: ``sqrt(2 * C * M)`` (the agent's and helper's rule)."""
    return math.sqrt(2.0 * max(checkpoint_cost_s, 0.0) * mtbi_s)


@dataclass(frozen=True)
class JobCost:
    monthly_rate: float
    mtbi_h: float
    interval_s: float  # Young/Daly checkpoint interval
    paid_h: float  # expected instance hours to finish the work
    interruptions: float  # expected number of interruptions
    cost_vs_on_demand: float  # spot cost / on-demand cost at the given discount
    break_even_discount: float  # spot is cheaper above this discount


def expected_job_cost(
    *,
    monthly_rate: float,
    discount: float,
    checkpoint_cost_s: float,
    restart_s: float,
    work_h: float = 24.0,
    emergency_checkpoint_s: Optional[float] = None,
) -> JobCost:
    """Expected cost of ``work_h`` hours of training on spot relative to on-demand (see the module docstring).

    ``emergency_checkpoint_s``: None models a notice that is not used (each interruption loses half an interval on
    average); a number models the agent's emergency checkpoint (each interruption costs that long instead).
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], not {discount}")
    if work_h <= 0 or checkpoint_cost_s < 0 or restart_s < 0:
        raise ValueError("work_h must be positive; checkpoint_cost_s and restart_s not negative")
    m_h = mtbi_h(monthly_rate)
    if math.isinf(m_h):
        return JobCost(monthly_rate, m_h, math.inf, work_h, 0.0, 1.0 - discount, 0.0)
    m_s = m_h * 3600.0
    tau_s = young_daly_s(checkpoint_cost_s, m_s)
    overhead = checkpoint_cost_s / tau_s if tau_s > 0 else 0.0
    lost_s = tau_s / 2.0 if emergency_checkpoint_s is None else emergency_checkpoint_s
    waste = (lost_s + restart_s) / m_s
    if waste >= 1.0:
        raise ValueError(f"an interruption costs more than the mean time between interruptions ({m_h:.2f} h)")
    paid_h = work_h * (1.0 + overhead) / (1.0 - waste)
    return JobCost(
        monthly_rate=monthly_rate,
        mtbi_h=m_h,
        interval_s=tau_s,
        paid_h=paid_h,
        interruptions=paid_h / m_h,
        cost_vs_on_demand=(1.0 - discount) * paid_h / work_h,
        break_even_discount=1.0 - work_h / paid_h,
    )
