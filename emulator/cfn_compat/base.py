"""What every compat model shares: the answers moto's CloudFormation asks of a resource type, reporting properties a
model does not emulate, CloudFormation's booleans.

moto finds a resource type's model among the *direct* subclasses of ``CloudFormationModel``
(``moto.cloudformation.parsing.get_model_list`` calls ``CloudFormationModel.__subclasses__()``). So
:class:`CompatModel` is a mixin, not a subclass of it: a compat model lists both, ``class Volume(CompatModel,
CloudFormationModel)``, stays a direct subclass that moto registers, and takes moto's questions (type, name property,
``Fn::GetAtt`` attributes, create/update/delete) from the mixin. It writes only what differs: its class attributes and
:meth:`CompatModel.create` (and :meth:`CompatModel.update` / :meth:`CompatModel.remove` where the defaults do not fit).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Optional

logger = logging.getLogger(__name__)
UNSUPPORTED_PROPERTY = "EMULATOR-UNSUPPORTED-PROPERTY"


def report_unsupported(resource_type: str, props: dict[str, Any], handled: set[str] | frozenset[str]) -> None:
    for key in sorted(set(props) - handled):
        logger.warning("%s %s.%s is not emulated", UNSUPPORTED_PROPERTY, resource_type, key)


def as_bool(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


class CompatModel:
    """The CloudFormation side of a compat model, driven by its class attributes.

    - ``CFN_TYPE``: the resource type (``AWS::EC2::Volume``).
    - ``NAME_PROPERTY``: the property that names the resource ("" where CloudFormation generates the name).
    - ``ATTRIBUTES``: ``Fn::GetAtt`` attribute -> the Python attribute of the model that answers it.
    - ``MOTO_MODEL``: for a model that returns moto's own resource, moto's class: it answers ``Fn::GetAtt`` and
      deletes the resource.
    - ``PROPERTIES``: the properties the model emulates; any other is reported as ``EMULATOR-UNSUPPORTED-PROPERTY``
      (``None``: the model takes every property as it comes).

    A model that returns an instance of itself names it by ``self.name`` (its physical id, its ``Ref``).
    """

    CFN_TYPE: ClassVar[str]
    NAME_PROPERTY: ClassVar[str] = ""
    ATTRIBUTES: ClassVar[Mapping[str, str]] = {}
    MOTO_MODEL: ClassVar[Optional[type[Any]]] = None
    PROPERTIES: ClassVar[Optional[frozenset[str]]] = None

    name: str

    @classmethod
    def cloudformation_type(cls) -> str:
        return cls.CFN_TYPE

    @classmethod
    def cloudformation_name_type(cls) -> str:
        return cls.NAME_PROPERTY

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        if cls.MOTO_MODEL is not None:
            return bool(cls.MOTO_MODEL.has_cfn_attr(attr))
        return attr in cls.ATTRIBUTES

    def get_cfn_attribute(self, attribute_name: str) -> Any:
        from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

        if attribute_name not in self.ATTRIBUTES:
            raise UnformattedGetAttTemplateException()
        return getattr(self, self.ATTRIBUTES[attribute_name])

    @property
    def physical_resource_id(self) -> str:
        return self.name

    def is_created(self) -> bool:
        return True

    @classmethod
    def properties(cls, cloudformation_json: dict[str, Any]) -> dict[str, Any]:
        """The resource's properties, each one the model does not emulate reported."""
        props: dict[str, Any] = cloudformation_json.get("Properties", {})
        if cls.PROPERTIES is not None:
            report_unsupported(cls.CFN_TYPE, props, cls.PROPERTIES)
        return props

    # moto's three calls, in moto's signatures.
    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        return cls.create(resource_name, cls.properties(cloudformation_json), account_id, region_name)

    @classmethod
    def update_from_cloudformation_json(
        cls,
        original_resource: Any,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> Any:
        props = cls.properties(cloudformation_json)
        return cls.update(original_resource, new_resource_name, props, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        cls.remove(resource_name, cloudformation_json.get("Properties", {}), account_id, region_name)

    # What a model writes.
    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> Any:
        """Create the resource named ``name`` (the name CloudFormation gave it) from ``props``; return it."""
        raise NotImplementedError

    @classmethod
    def update(cls, original: Any, new_name: str, props: dict[str, Any], account_id: str, region_name: str) -> Any:
        """Apply ``props`` to ``original``; by default a replacement: remove the original, create anew."""
        cls.remove(original.name, props, account_id, region_name)
        return cls.create(new_name, props, account_id, region_name)

    @classmethod
    def remove(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> None:
        """Delete the resource named ``name``; by default through moto's model."""
        if cls.MOTO_MODEL is None:
            raise NotImplementedError
        cls.MOTO_MODEL.delete_from_cloudformation_json(name, {"Properties": props}, account_id, region_name)
