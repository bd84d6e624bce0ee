"""trainctl cost's arithmetic on inputs built here: price averaging, redone work, the price file."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.cost import NodeCost, redone_work
from trainctl.prices import ON_DEMAND, PriceError, average_price, load_prices


def test_average_price_weights_each_price_by_the_time_it_was_in_effect() -> None:
    history = [(0.0, 1.0), (100.0, 3.0), (300.0, 2.0)]
    assert average_price(history, 50.0, 150.0) == pytest.approx((50 * 1.0 + 50 * 3.0) / 100)
    assert average_price(history, 100.0, 400.0) == pytest.approx((200 * 3.0 + 100 * 2.0) / 300)
    assert average_price(history, 500.0, 600.0) == 2.0  # the last price stays in effect
    assert average_price(history, 20.0, 20.0) == 1.0  # an instant: the price in effect then
    assert average_price([], 0.0, 10.0) is None


def _node(instance: str, start: float, end: float, price: float, itype: str = "g5.xlarge") -> NodeCost:
    return NodeCost(instance, itype, "spot", "us-east-1a", start, end, "group activity", price, ON_DEMAND[itype][0])


def test_redone_work_counts_steps_between_the_checkpoint_and_the_furthest_step_times_the_nodes() -> None:
    # two nodes train steps 10..50 (one line per 10 steps, 10 s apart); no notice: the job resumes from step 30
    events = [(10.0 * k, "job/i-a", f"step {10 * k} epoch 0 loss 0.5") for k in range(1, 6)]
    events += [(60.0, "job/i-c", "resume step: 30")]
    events += [(70.0, "job/i-c", "step 40 epoch 0 loss 0.5")]
    nodes = [_node("i-a", 0.0, 55.0, 0.4), _node("i-b", 0.0, 55.0, 0.4), _node("i-c", 58.0, 100.0, 0.4)]
    redone = redone_work(events, nodes, load_prices())
    assert redone.steps == 50 - 30
    # steps 31..50 first ran from the line of step 30 (t=30) to the line of step 50 (t=50), on i-a and i-b
    assert redone.node_hours == pytest.approx(2 * 20.0 / 3600)
    assert redone.gpu_hours == pytest.approx(2 * 20.0 * ON_DEMAND["g5.xlarge"][1] / 3600)
    assert redone.usd == pytest.approx(2 * 20.0 / 3600 * 0.4)


def test_a_resume_from_the_emergency_checkpoint_redoes_nothing() -> None:
    events = [
        (10.0, "job/i-a", "step 10 epoch 0 loss 0.5"),
        (14.0, "job/i-a", "interrupted: checkpoint 14 saved, exiting"),
        (30.0, "job/i-b", "resume step: 14"),
    ]
    redone = redone_work(events, [_node("i-a", 0.0, 20.0, 0.4)], load_prices())
    assert (redone.steps, redone.node_hours, redone.usd) == (0, 0.0, 0.0)


def test_gpu_hours_are_unknown_for_a_type_without_a_gpu_count() -> None:
    events = [
        (10.0, "j/i-a", "step 10 epoch 0 loss 1.0"),
        (20.0, "j/i-a", "step 20 epoch 0 loss 1.0"),
        (30.0, "j/i-b", "resume step: 10"),
    ]
    redone = redone_work(events, [_node("i-a", 0.0, 25.0, 0.1, itype="g5.xlarge")], load_prices())
    assert redone.gpu_hours == pytest.approx(10.0 / 3600)
    table = load_prices()
    node = NodeCost("i-a", "c7i.xlarge", "spot", "us-east-1a", 0.0, 25.0, "node logs", 0.1, 0.2)
    assert redone_work(events, [node], table).gpu_hours is None


def test_a_price_file_adds_types_and_bad_ones_say_what_to_fix(tmp_path: Path) -> None:
    good = tmp_path / "prices.yaml"
    good.write_text("c7i.xlarge: 0.1785\ng5.xlarge: 1.1\n")
    table = load_prices(good)
    assert table.on_demand_price("c7i.xlarge") == 0.1785 and table.on_demand_price("g5.xlarge") == 1.1
    assert table.on_demand_price("g4dn.xlarge") == ON_DEMAND["g4dn.xlarge"][0]
    with pytest.raises(PriceError) as missing:
        load_prices().on_demand_price("x9.huge")
    assert str(missing.value).startswith("no on-demand price for x9.huge (source: https://aws.amazon.com/ec2/pricing")
    assert str(missing.value).endswith("pass --prices FILE with a line '<type>: <USD per hour>'")
    for text, message in (
        ("g5.xlarge: -1\n", f"{tmp_path}/bad.yaml: g5.xlarge: price must be a positive number of USD per hour, got -1"),
        (
            "- g5.xlarge\n",
            f"{tmp_path}/bad.yaml: expected a mapping of instance type to USD per hour, e.g. 'g5.xlarge: 1.006'",
        ),
        ("g5.xlarge: [1\n", f"{tmp_path}/bad.yaml: cannot read prices (ParserError: while parsing a flow sequence)"),
    ):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(PriceError) as bad:
            load_prices(tmp_path / "bad.yaml")
        assert str(bad.value) == message
    with pytest.raises(PriceError, match=r"nope.yaml: cannot read prices \(FileNotFoundError"):
        load_prices(tmp_path / "nope.yaml")


def test_a_restart_logged_by_every_node_is_counted_once() -> None:
    events = [(10.0 * k, "job/i-a", f"step {10 * k} epoch 0 loss 0.5") for k in range(1, 6)]
    events += [(60.0, "job/i-c", "resume step: 30"), (60.5, "job/i-b", "resume step: 30")]
    nodes = [_node("i-a", 0.0, 55.0, 0.4), _node("i-b", 0.0, 80.0, 0.4), _node("i-c", 58.0, 80.0, 0.4)]
    redone = redone_work(events, nodes, load_prices())
    assert redone.steps == 50 - 30
    assert redone.node_hours == pytest.approx(2 * 20.0 / 3600)  # i-a and i-b ran steps 31..50 (t=30..50)
