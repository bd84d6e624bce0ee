"""CloudFormation itself (items 4 and 10 of :mod:`emulator.cfn_compat`): the CDK's metadata resource, and
ExecuteChangeSet's outputs and failures.

4. ``AWS::CDK::Metadata``: the CDK's analytics resource, no AWS API behind it. -> A no-op model, so
   moto does not warn about it.
10. ``ExecuteChangeSet`` (how the CDK CLI deploys): moto applies the change set but never rebuilds
    the stack's outputs from the new template (``describe_stacks`` shows none), and when a resource
    fails it answers HTTP 500, which the CLI retries into an empty "successful" deploy. -> After
    moto's ``execute_change_set`` the stack's template and outputs are rebuilt; if it raises, the
    stack ends ``ROLLBACK_COMPLETE`` (``UPDATE_ROLLBACK_COMPLETE`` for an update) with a
    ``CREATE_FAILED``/``UPDATE_FAILED`` event carrying the error, as CloudFormation reports it, and
    the traceback goes to the server log. A change set named without its ARN is looked up within
    the given stack (moto takes the first of that name in any stack).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from moto.core.common_models import CloudFormationModel

from emulator.cfn_compat.base import CompatModel
from emulator.moto_patch import original, patch

logger = logging.getLogger(__name__)


# --- 4. CDK metadata -------------------------------------------------------------------------------


class CdkMetadata(CompatModel, CloudFormationModel):
    """``AWS::CDK::Metadata``: the CDK's usage-analytics record; there is nothing to create."""

    CFN_TYPE = "AWS::CDK::Metadata"

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> CdkMetadata:
        return cls(name)

    @classmethod
    def update(
        cls, original: CdkMetadata, new_name: str, props: dict[str, Any], account_id: str, region_name: str
    ) -> CdkMetadata:
        return original

    @classmethod
    def remove(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> None:
        return None

    def delete(self, account_id: str, region_name: str) -> None:
        return None


# --- 10. ExecuteChangeSet: outputs and failures ---------------------------------------------------------


def _execute_change_set(self: Any, change_set_name: str, stack_name: Optional[str] = None) -> None:
    # moto looks a change set up by name across all stacks; CloudFormation by name within the stack.
    change_set = self.change_sets.get(change_set_name) or next(
        (
            cs
            for cs in self.change_sets.values()
            if cs.change_set_name == change_set_name and stack_name in (None, cs.stack_name, cs.stack_id)
        ),
        None,
    )
    from moto.cloudformation.models import CloudFormationBackend

    moto_execute = original(CloudFormationBackend, "execute_change_set")
    try:
        moto_execute(self, change_set.change_set_id if change_set else change_set_name, stack_name)
    except Exception as error:
        if change_set is None:
            raise
        logger.exception("ExecuteChangeSet %s failed", change_set_name)
        stack = self.stacks[change_set.stack_id]
        verb = "CREATE" if change_set.change_set_type == "CREATE" else "UPDATE"
        stack._add_stack_event(f"{verb}_FAILED", resource_status_reason=f"{type(error).__name__}: {error}")
        stack.status = "ROLLBACK_COMPLETE" if verb == "CREATE" else "UPDATE_ROLLBACK_COMPLETE"
        stack._add_stack_event(stack.status)
        change_set.execution_status = "EXECUTE_FAILED"
        return
    if change_set is not None:
        stack = self.stacks[change_set.stack_id]
        stack._parse_template()
        stack.output_map = stack._create_output_map()


def patch_moto() -> None:
    """ExecuteChangeSet with outputs and failures (item 10)."""
    from moto.cloudformation.models import CloudFormationBackend

    patch(CloudFormationBackend, "execute_change_set", _execute_change_set)
