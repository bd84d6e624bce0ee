"""How the emulated cloud's drill runner reads an FIS experiment: durations, selection modes, the CloudFormation
properties in the API's shape (no emulator started)."""

from __future__ import annotations

import pytest

from emulator.cfn_compat.fis import api_shape
from emulator.fis_drills import DrillFailed, duration_s, select


@pytest.mark.parametrize(("text", "seconds"), [("PT2M", 120), ("PT90S", 90), ("PT1H", 3600), ("PT1M30S", 90)])
def test_a_duration_is_read_as_iso_8601(text: str, seconds: float) -> None:
    assert duration_s(text) == seconds


@pytest.mark.parametrize("text", ["2M", "PT", "P1D", "PT2m"])
def test_a_duration_fis_would_refuse_fails_the_experiment_with_its_value(text: str) -> None:
    with pytest.raises(DrillFailed, match=f"durationBeforeInterruption {text!r} is no ISO 8601 duration"):
        duration_s(text)


def first(found: list[str], count: int) -> list[str]:
    return found[:count]


@pytest.mark.parametrize(
    ("mode", "found", "chosen"),
    [
        ("PERCENT(50)", ["i-1", "i-2"], ["i-1"]),
        ("PERCENT(100)", ["i-1", "i-2"], ["i-1", "i-2"]),
        ("PERCENT(50)", ["i-1", "i-2", "i-3"], ["i-1"]),  # rounded down
        ("PERCENT(10)", ["i-1", "i-2"], ["i-1"]),  # at least one
        ("PERCENT(50)", [], []),
        ("COUNT(1)", ["i-1", "i-2"], ["i-1"]),
        ("COUNT(5)", ["i-1", "i-2"], ["i-1", "i-2"]),
        ("ALL", ["i-1", "i-2", "i-3"], ["i-1", "i-2", "i-3"]),
    ],
)
def test_the_selection_mode_picks_how_many_targets(mode: str, found: list[str], chosen: list[str]) -> None:
    assert select(found, mode, pick=first) == chosen


def test_percent_picks_at_random() -> None:
    picks = {tuple(select(["i-1", "i-2", "i-3", "i-4"], "PERCENT(50)")) for _ in range(200)}
    assert len(picks) > 1 and all(len(p) == 2 for p in picks)


def test_an_unknown_selection_mode_fails_the_experiment() -> None:
    with pytest.raises(DrillFailed, match=r"selectionMode 'HALF' is not ALL, COUNT\(n\) or PERCENT\(n\)"):
        select(["i-1"], "HALF")


def test_the_template_s_properties_take_the_api_s_shape_and_keep_the_user_s_names() -> None:
    props = {
        "Description": "drill",
        "RoleArn": "arn:aws:iam::123456789012:role/fis",
        "StopConditions": [{"Source": "aws:cloudwatch:alarm", "Value": "arn:alarm"}],
        "Targets": {
            "ClusterSpotInstances": {
                "ResourceType": "aws:ec2:spot-instance",
                "SelectionMode": "PERCENT(50)",
                "ResourceTags": {"spot-training:team": "t", "spot-training:cluster": "main"},
                "Filters": [{"Path": "State.Name", "Values": ["running"]}],
            }
        },
        "Actions": {
            "SendInterruptionNotices": {
                "ActionId": "aws:ec2:send-spot-instance-interruptions",
                "Parameters": {"durationBeforeInterruption": "PT2M"},
                "Targets": {"SpotInstances": "ClusterSpotInstances"},
            }
        },
        "Tags": {"Name": "t-main-interruption-drill", "spot-training:team": "t"},
    }
    assert api_shape(props) == {
        "description": "drill",
        "roleArn": "arn:aws:iam::123456789012:role/fis",
        "stopConditions": [{"source": "aws:cloudwatch:alarm", "value": "arn:alarm"}],
        "targets": {
            "ClusterSpotInstances": {
                "resourceType": "aws:ec2:spot-instance",
                "selectionMode": "PERCENT(50)",
                "resourceTags": {"spot-training:team": "t", "spot-training:cluster": "main"},
                "filters": [{"path": "State.Name", "values": ["running"]}],
            }
        },
        "actions": {
            "SendInterruptionNotices": {
                "actionId": "aws:ec2:send-spot-instance-interruptions",
                "parameters": {"durationBeforeInterruption": "PT2M"},
                "targets": {"SpotInstances": "ClusterSpotInstances"},
            }
        },
        "tags": {"Name": "t-main-interruption-drill", "spot-training:team": "t"},
    }
