"""Fault Injection Service (item 13 of :mod:`emulator.cfn_compat`): ``AWS::FIS::ExperimentTemplate``.

13. ``AWS::FIS::ExperimentTemplate``: no CloudFormation type (moto has the FIS API). -> A model that creates the
    template through moto's FIS backend, its properties turned into the API's shape (``Targets.X.ResourceTags`` ->
    ``targets.X.resourceTags``, ...), so ``GetExperimentTemplate`` and ``StartExperiment`` see what the stack says;
    ``Ref`` and ``Fn::GetAtt Id`` are the template's id. It is deleted with the stack. What a started experiment
    does in the emulated cloud is :mod:`emulator.fis_drills`'s (moto itself only stores it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from moto.core.common_models import CloudFormationModel

from emulator.cfn_compat.base import CompatModel


def api_shape(value: Any) -> Any:
    """CloudFormation's PascalCase keys as the FIS API's camelCase ones, all the way down; the keys of the maps
    the user names (targets, actions, tags, parameters, resource tags) are kept as they are."""
    if isinstance(value, list):
        return [api_shape(v) for v in value]
    if not isinstance(value, dict):
        return value
    shaped = {}
    for key, item in value.items():
        api_key = key[:1].lower() + key[1:]
        named_map = api_key in ("targets", "actions", "parameters", "resourceTags", "tags") and isinstance(item, dict)
        if named_map and api_key in ("targets", "actions") and _is_definitions(item):
            shaped[api_key] = {name: api_shape(definition) for name, definition in item.items()}
        elif named_map:
            shaped[api_key] = dict(item)  # names (or values) the user chose: as written
        else:
            shaped[api_key] = api_shape(item)
    return shaped


def _is_definitions(value: dict[str, Any]) -> bool:
    """A template's ``Targets``/``Actions`` map (name -> definition), not an action's ``Targets`` (role -> name)."""
    return all(isinstance(v, dict) for v in value.values())


class ExperimentTemplate(CompatModel, CloudFormationModel):
    """``AWS::FIS::ExperimentTemplate`` through moto's FIS backend; ``Ref`` = ``Fn::GetAtt Id`` = the template id."""

    CFN_TYPE = "AWS::FIS::ExperimentTemplate"
    ATTRIBUTES: ClassVar[Mapping[str, str]] = {"Id": "name"}
    PROPERTIES = frozenset(
        {
            "Description",
            "RoleArn",
            "StopConditions",
            "Targets",
            "Actions",
            "Tags",
            "LogConfiguration",
            "ExperimentOptions",
            "ExperimentReportConfiguration",
        }
    )

    def __init__(self, account_id: str, region_name: str, name: str) -> None:
        self.account_id, self.region_name, self.name = account_id, region_name, name

    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> ExperimentTemplate:
        from moto.fis.models import fis_backends

        shaped = api_shape(props)
        created = fis_backends[account_id][region_name].create_experiment_template(
            client_token=None,
            description=shaped.get("description", ""),
            stop_conditions=shaped.get("stopConditions", []),
            targets=shaped.get("targets", {}),
            actions=shaped.get("actions", {}),
            role_arn=shaped["roleArn"],
            tags=shaped.get("tags"),
            log_configuration=shaped.get("logConfiguration"),
            experiment_options=shaped.get("experimentOptions"),
            experiment_report_configuration=shaped.get("experimentReportConfiguration"),
        )
        return cls(account_id, region_name, created["id"])

    @classmethod
    def update(
        cls, original: ExperimentTemplate, new_name: str, props: dict[str, Any], account_id: str, region_name: str
    ) -> ExperimentTemplate:
        original.delete(account_id, region_name)
        return cls.create(new_name, props, account_id, region_name)

    @classmethod
    def remove(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> None:
        cls(account_id, region_name, name).delete(account_id, region_name)

    def delete(self, account_id: str, region_name: str) -> None:
        from moto.fis.models import fis_backends

        backend = fis_backends[self.account_id][self.region_name]
        if self.name in backend.experiment_templates:
            backend.delete_experiment_template(self.name)
