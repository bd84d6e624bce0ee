"""EC2 Auto Scaling's terminating lifecycle hooks (``Terminating:Wait``), which moto lacks; installed in the server.

moto (5.2.5) stores lifecycle hooks (PutLifecycleHook, DescribeLifecycleHooks, DeleteLifecycleHook) but never applies
them: a scale-in or TerminateInstanceInAutoScalingGroup terminates the instance at once, and it has no
CompleteLifecycleAction or RecordLifecycleActionHeartbeat. For a group with an ``autoscaling:EC2_INSTANCE_TERMINATING``
hook, :func:`install` makes moto do what EC2 Auto Scaling does:

- **Scale-in** (SetDesiredCapacity, UpdateAutoScalingGroup, anything that brings the desired capacity below the
  number of InService instances) picks InService, unprotected instances (moto picks among all of the group's
  instances, a waiting one included) and puts them in ``Terminating:Wait`` instead of terminating them; so does
  **TerminateInstanceInAutoScalingGroup**, with or without decrement. A waiting instance stays in the group
  (DescribeAutoScalingGroups, DescribeAutoScalingInstances) with that state, its EC2 instance keeps running, and it
  does not count toward capacity: without decrement a replacement launches at once. Terminating an instance that
  is not InService or Standby answers ``ValidationError`` "The instance i-... is not in InService or Standby.".
- **CompleteLifecycleAction** (by InstanceId or LifecycleActionToken; CONTINUE and ABANDON both end a terminating
  wait, ABANDON also ends the instance's waits for the group's other hooks) terminates the EC2 instance and removes
  it from the group once no hook holds it. With no active wait: ``ValidationError`` "No active Lifecycle Action
  found with instance ID i-..." (AWS's text).
- **RecordLifecycleActionHeartbeat** restarts the wait's heartbeat timer.
- After ``HeartbeatTimeout`` seconds without completion (or after the global timeout, 100 x HeartbeatTimeout but at
  most 48 h, however many heartbeats) the hook's ``DefaultResult`` applies: a timer thread in the server process.
- An instance EC2 already took (``shutting-down``/``terminated``, a spot reclaim) is never held: moto's path. One
  that leaves its group another way while waiting (EC2 TerminateInstances, DetachInstances) ends its waits.
- DeleteLifecycleHook first completes the hook's waits with CONTINUE (as AWS does); DeleteAutoScalingGroup ends the
  group's waits and terminates their instances at once, as AWS's ``ForceDelete`` (moto deletes a group with
  instances either way).

Groups without a terminating hook behave exactly as in moto. Not emulated: notifications (there is no notification
target nor EventBridge event; an instance learns from its metadata, ``autoscaling/target-lifecycle-state``), launching
hooks (``Pending:Wait``) and the ``Terminating:Proceed`` step (a completed instance leaves the group at once).

``EMULATOR_LIFECYCLE_HEARTBEAT_SCALE`` (environment of the server, read by :func:`install`; default 1) multiplies
every heartbeat and global timeout, so that a test can give a hook AWS's minimum ``HeartbeatTimeout`` (30 s) and
see it expire in seconds (0.1: 3 s).
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from moto.autoscaling.exceptions import ValidationError
from moto.autoscaling.models import (
    AutoScalingBackend,
    FakeAutoScalingGroup,
    InstanceState,
    LifecycleHook,
    TerminateInstanceActivity,
)
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult, EmptyResult
from moto.ec2.models import EC2Backend

from emulator.moto_patch import original, patch

TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
WAIT = "Terminating:Wait"
RESULTS = ("CONTINUE", "ABANDON")
EC2_GONE = ("shutting-down", "terminated")
GLOBAL_TIMEOUT_MAX_S = 48 * 3600
SCALE_ENV = "EMULATOR_LIFECYCLE_HEARTBEAT_SCALE"

_LOCK = threading.RLock()  # around every change of the waits (request threads and timer threads)
_scale = 1.0
# Set while a group is deleted: its hooks hold nothing (ForceDelete).
_FORCE: contextvars.ContextVar[bool] = contextvars.ContextVar("emulator_lifecycle_force", default=False)

_EC2_TERMINATE = EC2Backend.terminate_instances


@dataclass(eq=False)
class _Action:
    """One hook's wait for one instance (AWS's lifecycle action)."""

    group: FakeAutoScalingGroup
    state: InstanceState
    hook: LifecycleHook
    expires: float  # time.monotonic() of the global timeout
    token: str = field(default_factory=lambda: str(uuid.uuid4()))
    generation: int = 0  # a timer armed for an earlier generation does nothing
    timer: Optional[threading.Timer] = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.state.instance.id, self.hook.name)

    @property
    def backend(self) -> AutoScalingBackend:
        return self.group.autoscaling_backend


def _actions(backend: AutoScalingBackend) -> dict[tuple[str, str], _Action]:
    """The active waits of one backend, by (instance id, hook name); kept on the backend, so a reset clears them."""
    actions: Optional[dict[tuple[str, str], _Action]] = getattr(backend, "compat_lifecycle_actions", None)
    if actions is None:
        actions = {}
        backend.compat_lifecycle_actions = actions  # type: ignore[attr-defined]
    return actions


def _terminating_hooks(group: FakeAutoScalingGroup) -> list[LifecycleHook]:
    if _FORCE.get():
        return []
    return [
        hook
        for hook in group.autoscaling_backend.lifecycle_hooks.values()
        if hook.auto_scaling_group_name == group.name and hook.lifecycle_transition == TERMINATING
    ]


def _hold(group: FakeAutoScalingGroup, states: list[InstanceState], hooks: list[LifecycleHook]) -> None:
    """Put ``states`` in ``Terminating:Wait``: one action per hook, each with its heartbeat timer."""
    now = time.monotonic()
    for state in states:
        state.lifecycle_state = WAIT
        for hook in hooks:
            global_timeout = min(100 * hook.heartbeat_timeout, GLOBAL_TIMEOUT_MAX_S) * _scale
            action = _Action(group, state, hook, expires=now + global_timeout)
            _actions(group.autoscaling_backend)[action.key] = action
            _arm(action)


def _arm(action: _Action) -> None:
    """(Re)start the action's heartbeat timer."""
    if action.timer is not None:
        action.timer.cancel()
    action.generation += 1
    delay = min(action.hook.heartbeat_timeout * _scale, action.expires - time.monotonic())
    action.timer = threading.Timer(max(delay, 0.0), _expire, args=(action, action.generation))
    action.timer.daemon = True
    action.timer.name = f"lifecycle-{action.state.instance.id}"
    action.timer.start()


def _expire(action: _Action, generation: int) -> None:
    with _LOCK:
        if action.generation == generation and _live(action):
            _end(action, action.hook.default_result)


def _live(action: _Action) -> bool:
    """Whether the action still holds its instance; one whose instance left its group another way is dropped."""
    backend = action.backend
    if _actions(backend).get(action.key) is not action:
        return False
    group = backend.autoscaling_groups.get(action.group.name)
    if group is action.group and action.state in group.instance_states and action.state.lifecycle_state == WAIT:
        return True
    _drop(action)
    return False


def _drop(action: _Action) -> None:
    if _actions(action.backend).get(action.key) is action:
        del _actions(action.backend)[action.key]
    if action.timer is not None:
        action.timer.cancel()


def _end(action: _Action, result: str) -> None:
    """End the action with ``result``; once no hook holds the instance, terminate it and take it out of its group."""
    actions = _actions(action.backend)
    state = action.state
    for other in [a for a in actions.values() if a.state is state] if result == "ABANDON" else [action]:
        _drop(other)
    if any(a.state is state for a in actions.values()):
        return  # another hook of the group still holds it
    group = action.group
    group.instance_states = [s for s in group.instance_states if s is not state]
    if state.instance.state not in EC2_GONE:
        _EC2_TERMINATE(group.autoscaling_backend.ec2_backend, [state.instance.id])
    if group.name in group.autoscaling_backend.autoscaling_groups:
        group.autoscaling_backend.update_attached_elbs(group.name)


# --- patched moto methods -----------------------------------------------------------------------------------------


def _set_desired_capacity(self: FakeAutoScalingGroup, new_capacity: Optional[int]) -> None:
    hooks = _terminating_hooks(self)
    if not hooks:
        original(FakeAutoScalingGroup, "set_desired_capacity")(self, new_capacity)
        return
    with _LOCK:
        # The instances above the new capacity (InService, unprotected, in the group's order) are held in place, so
        # no describe ever misses them; moto then counts only the InService ones and has nothing left to remove.
        # Instance weights are not modelled (moto's count assumes weight 1 but for the first override's; ours have
        # none).
        target = self.min_size if new_capacity is None else new_capacity
        active = self.active_instances()
        excess = len(active) - (target or 0)
        if excess > 0:
            _hold(self, [s for s in active if not s.protected_from_scale_in][:excess], hooks)
        original(FakeAutoScalingGroup, "set_desired_capacity")(self, new_capacity)


def _terminate_instance(self: AutoScalingBackend, instance_id: str, should_decrement: bool) -> Any:
    with _LOCK:
        state = next(
            (s for g in self.autoscaling_groups.values() for s in g.instance_states if s.instance.id == instance_id),
            None,
        )
        if state is not None and state.lifecycle_state not in ("InService", "Standby"):
            raise ValidationError(f"The instance {instance_id} is not in InService or Standby.")
        group = state.auto_scaling_group if state is not None else None
        hooks = _terminating_hooks(group) if group is not None else []
        if state is None or group is None or not hooks or state.instance.state in EC2_GONE:
            return original(AutoScalingBackend, "terminate_instance")(self, instance_id, should_decrement)
        original_size = group.desired_capacity
        if should_decrement:
            group.desired_capacity = original_size - 1
        _hold(group, [state], hooks)
        group.set_desired_capacity(group.desired_capacity)  # without decrement: the replacement
        return TerminateInstanceActivity(state.instance, original_size)


def _delete_auto_scaling_group(self: AutoScalingBackend, group_name: str) -> None:
    with _LOCK:
        for action in [a for a in _actions(self).values() if a.group.name == group_name]:
            if _live(action):
                _end(action, "ABANDON")
        token = _FORCE.set(True)
        try:
            original(AutoScalingBackend, "delete_auto_scaling_group")(self, group_name)
        finally:
            _FORCE.reset(token)


def _delete_lifecycle_hook(self: AutoScalingBackend, as_name: str, name: str) -> None:
    with _LOCK:
        for action in [a for a in _actions(self).values() if a.group.name == as_name and a.hook.name == name]:
            if _live(action):
                _end(action, "CONTINUE")
        original(AutoScalingBackend, "delete_lifecycle_hook")(self, as_name, name)


# --- new Auto Scaling actions -------------------------------------------------------------------------------------


def _active_action(response: AutoScalingResponse) -> _Action:
    """The wait a CompleteLifecycleAction / RecordLifecycleActionHeartbeat request names (call with _LOCK held)."""
    group_name = response._get_param("AutoScalingGroupName")
    hook_name = response._get_param("LifecycleHookName")
    instance_id = response._get_param("InstanceId")
    token = response._get_param("LifecycleActionToken")
    if not instance_id and not token:
        raise ValidationError("Either InstanceId or LifecycleActionToken must be specified.")
    for action in list(_actions(response.autoscaling_backend).values()):
        if (
            action.group.name == group_name
            and action.hook.name == hook_name
            and (not instance_id or action.state.instance.id == instance_id)
            and (not token or action.token == token)
            and _live(action)
        ):
            return action
    if instance_id:
        raise ValidationError(f"No active Lifecycle Action found with instance ID {instance_id}")
    raise ValidationError(f"No active Lifecycle Action found with token {token}")


def _complete_lifecycle_action(self: AutoScalingResponse) -> ActionResult:
    result = self._get_param("LifecycleActionResult")
    if result not in RESULTS:
        raise ValidationError(f"LifecycleActionResult must be CONTINUE or ABANDON, not {result}")
    with _LOCK:
        _end(_active_action(self), result)
    return EmptyResult()


def _record_lifecycle_action_heartbeat(self: AutoScalingResponse) -> ActionResult:
    with _LOCK:
        _arm(_active_action(self))
    return EmptyResult()


def _heartbeat_scale() -> float:
    raw = os.environ.get(SCALE_ENV, "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = math.nan
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{SCALE_ENV} must be a positive number, not {raw!r}")
    return scale


def install() -> None:
    """Idempotent: terminating lifecycle hooks in every Auto Scaling backend of this process (see the module doc)."""
    global _scale
    _scale = _heartbeat_scale()
    patch(FakeAutoScalingGroup, "set_desired_capacity", _set_desired_capacity)
    patch(AutoScalingBackend, "terminate_instance", _terminate_instance)
    patch(AutoScalingBackend, "delete_auto_scaling_group", _delete_auto_scaling_group)
    patch(AutoScalingBackend, "delete_lifecycle_hook", _delete_lifecycle_hook)
    patch(AutoScalingResponse, "complete_lifecycle_action", _complete_lifecycle_action)
    patch(AutoScalingResponse, "record_lifecycle_action_heartbeat", _record_lifecycle_action_heartbeat)
