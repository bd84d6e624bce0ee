"""benchmarks/control_plane.py's report and benchmarks/report.py's splice of one section into RESULTS.md (the
measurement itself runs in ``make bench``, never in the tests)."""

from __future__ import annotations

from benchmarks.control_plane import CallRates, section
from benchmarks.report import replace_section

DESCRIBE = "autoscaling:DescribeAutoScalingGroups"


def rates(nodes: int, describe_calls: int, puts: int) -> CallRates:
    return CallRates(nodes, 60.0, {DESCRIBE: describe_calls, "s3:PutObject": puts}, booted_s=10.0)


def test_the_section_compares_cluster_and_per_node_rates_and_projects_a_straight_line() -> None:
    text = "\n".join(section([rates(4, 48, 4), rates(16, 192, 4)]))
    assert f"| `{DESCRIBE}` | 48.0 / 12.00 | 192.0 / 12.00 |" in text
    assert "| `s3:PutObject` | 4.0 / 1.00 | 4.0 / 0.25 |" in text
    assert "at 16 nodes / at 4 nodes: **4.00** (goal <= 1.5)" in text
    # 0.8/s at 4 nodes, 3.2/s at 16: 0.2/s per node, so 0.8 + 0.2 * 996 at 1,000 nodes
    assert "Projected to 1,000 nodes (a straight line through 4 and 16 nodes): **200.0** Describe calls" in text


def test_a_rate_that_barely_grows_projects_a_low_rate() -> None:
    text = "\n".join(section([rates(4, 12, 4), rates(32, 13, 4)]))
    assert "at 32 nodes / at 4 nodes: **1.08**" in text
    # 0.2/s at 4 nodes, 0.2167/s at 32: one more call a minute over 28 nodes, about 0.6/s more over 996
    assert "**0.8** Describe calls a second" in text


def test_only_the_named_section_is_replaced_and_a_missing_one_is_appended() -> None:
    head = "# Benchmark results\n\n| a |\n\n## 4. Notice\n\nold notice\n\n"
    results = head + "## Control plane\n\nold\n\n## 5. Boot\n\nb\n"
    replaced = replace_section(results, "## Control plane", "## Control plane\n\nnew")
    assert replaced == head + "## Control plane\n\nnew\n\n## 5. Boot\n\nb\n"
    appended = replace_section("# Benchmark results\n\n| a |\n", "## Control plane", "## Control plane\n\nnew\n")
    assert appended == "# Benchmark results\n\n| a |\n\n## Control plane\n\nnew\n"
