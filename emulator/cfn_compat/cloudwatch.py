"""CloudWatch alarms (item 14 of :mod:`emulator.cfn_compat`): ``AWS::CloudWatch::Alarm``.

14. ``AWS::CloudWatch::Alarm``: no CloudFormation type in moto (it has the CloudWatch API), and an interruption
    drill's FIS template names its stop-condition alarm by ``Fn::GetAtt Arn``. -> A model that puts the metric
    alarm through moto's CloudWatch backend (``DescribeAlarms`` returns it; its state is moto's, ``SetAlarmState``
    changes it: moto does not evaluate metrics) and deletes it with the stack; ``Ref`` = its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from moto.core.common_models import CloudFormationModel

from emulator.cfn_compat.base import CompatModel, as_bool


class Alarm(CompatModel, CloudFormationModel):
    """``AWS::CloudWatch::Alarm`` (a metric alarm) through moto's CloudWatch backend."""

    CFN_TYPE = "AWS::CloudWatch::Alarm"
    NAME_PROPERTY = "AlarmName"
    ATTRIBUTES: ClassVar[Mapping[str, str]] = {"Arn": "arn"}
    PROPERTIES = frozenset(
        {
            "AlarmName",
            "AlarmDescription",
            "ComparisonOperator",
            "Dimensions",
            "EvaluationPeriods",
            "DatapointsToAlarm",
            "MetricName",
            "Namespace",
            "Period",
            "Statistic",
            "Threshold",
            "TreatMissingData",
            "AlarmActions",
            "OKActions",
            "InsufficientDataActions",
            "ActionsEnabled",
            "Unit",
            "Tags",
        }
    )

    def __init__(self, account_id: str, region_name: str, name: str, arn: str) -> None:
        self.account_id, self.region_name, self.name, self.arn = account_id, region_name, name, arn

    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> Alarm:
        from moto.cloudwatch.models import cloudwatch_backends

        alarm_name = props.get("AlarmName", name)
        alarm = cloudwatch_backends[account_id][region_name].put_metric_alarm(
            name=alarm_name,
            namespace=props["Namespace"],
            metric_name=props["MetricName"],
            comparison_operator=props["ComparisonOperator"],
            evaluation_periods=int(props["EvaluationPeriods"]),
            period=int(props["Period"]),
            threshold=float(props["Threshold"]),
            statistic=props["Statistic"],
            description=props.get("AlarmDescription", ""),
            dimensions=[{"Name": d["Name"], "Value": d["Value"]} for d in props.get("Dimensions", [])],
            alarm_actions=props.get("AlarmActions", []),
            ok_actions=props.get("OKActions", []),
            insufficient_data_actions=props.get("InsufficientDataActions", []),
            datapoints_to_alarm=int(props["DatapointsToAlarm"]) if "DatapointsToAlarm" in props else None,
            unit=props.get("Unit"),
            actions_enabled=as_bool(props.get("ActionsEnabled", True)),
            treat_missing_data=props.get("TreatMissingData"),
            tags=[{"Key": t["Key"], "Value": t["Value"]} for t in props.get("Tags", [])],
        )
        return cls(account_id, region_name, alarm_name, alarm.alarm_arn)

    @classmethod
    def update(cls, original: Alarm, new_name: str, props: dict[str, Any], account_id: str, region_name: str) -> Alarm:
        original.delete(account_id, region_name)
        return cls.create(new_name, props, account_id, region_name)

    @classmethod
    def remove(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> None:
        cls(account_id, region_name, props.get("AlarmName", name), "").delete(account_id, region_name)

    def delete(self, account_id: str, region_name: str) -> None:
        from moto.cloudwatch.models import cloudwatch_backends

        cloudwatch_backends[self.account_id][self.region_name].delete_alarms([self.name])
