"""What every compat model shares: reporting properties it does not emulate, CloudFormation's booleans, the
answers of a model named by ``self.name`` with no attributes."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)
UNSUPPORTED_PROPERTY = "EMULATOR-UNSUPPORTED-PROPERTY"


def report_unsupported(resource_type: str, props: dict[str, Any], handled: set[str]) -> None:
    for key in sorted(set(props) - handled):
        logger.warning("%s %s.%s is not emulated", UNSUPPORTED_PROPERTY, resource_type, key)


def as_bool(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


class NamedWithoutAttributes:
    """What a model whose physical id is ``self.name`` and that has no ``Fn::GetAtt`` attributes answers."""

    name: str

    @staticmethod
    def cloudformation_name_type() -> str:
        return ""

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return False

    @property
    def physical_resource_id(self) -> str:
        return self.name

    def is_created(self) -> bool:
        return True
