"""The emulated FIS's experiments, in the server process: their state is what the drill runner reports.

moto stores a started experiment and moves its state on by itself (one step per ``GetExperiment``), whatever
happens to its targets. In the emulated cloud an experiment acts (:mod:`emulator.fis_drills`, in the process that
runs the nodes), so :func:`install` holds every experiment where it is (moto's state manager: manual progression,
never reached), and :func:`serving` adds one route to the endpoint, ``POST /_emulator/fis/experiments/<id>`` with
``{"status": ..., "reason": ..., "targets": [{"resourceType", "targetName", "arn"}]}``, through which the drill runner
sets an experiment's state (and its reason), and the targets it resolved (``ListExperimentResolvedTargets`` then
lists them, as on AWS). ``StopExperiment`` still sets ``stopping`` (moto's own), which the drill runner acts on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from emulator.moto_patch import original, patch
from emulator.request_counts import WsgiApp
from emulator.settings import ACCOUNT_ID, REGION

ROUTE = "/_emulator/fis/experiments/"
STATES = ("pending", "initiating", "running", "completed", "stopping", "stopped", "failed")
_NEVER = 10**12  # GetExperiment calls before moto would move an experiment on by itself


def install() -> None:
    """Experiments keep the state the drill runner sets; their resolved targets are the ones it reports."""
    from moto.fis.models import Experiment, ResolvedTarget
    from moto.moto_api import state_manager

    state_manager.set_transition("fis::experiment", {"progression": "manual", "times": _NEVER})

    def resolved_targets(self: Experiment) -> list[ResolvedTarget]:
        reported = getattr(self, "emulator_targets", None)
        if reported is None:
            return list(original(Experiment, "resolved_targets")(self))
        return [ResolvedTarget(t["resourceType"], t["targetName"], t["arn"]) for t in reported]

    patch(Experiment, "resolved_targets", resolved_targets)


def set_state(experiment_id: str, update: dict[str, Any]) -> dict[str, Any]:
    """Set the experiment's state (``status``, ``reason``) and, given ``targets``, its resolved targets."""
    from moto.fis.models import Experiment, fis_backends

    experiments = fis_backends[ACCOUNT_ID][REGION].experiments
    if experiment_id not in experiments:
        raise KeyError(f"no experiment {experiment_id}")
    experiment = experiments[experiment_id]
    status = update["status"]
    if status not in STATES:
        raise ValueError(f"no FIS experiment state {status!r}")
    experiment.status = status
    # An instance attribute over moto's class-wide reasons: this experiment's own reason for its state.
    vars(experiment)["STATUS_REASONS"] = {**Experiment.STATUS_REASONS, status: str(update.get("reason") or status)}
    if "targets" in update:  # moto's class has no such field
        vars(experiment)["emulator_targets"] = list(update["targets"])
    return {"id": experiment_id, "status": status}


def serving(app: WsgiApp) -> WsgiApp:
    """``app`` with the route that sets an experiment's state (see the module doc)."""

    def wrapped(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO", ""))
        if not path.startswith(ROUTE) or environ.get("REQUEST_METHOD") != "POST":
            return app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        try:
            answer, code = set_state(path[len(ROUTE) :], json.loads(environ["wsgi.input"].read(length))), "200 OK"
        except KeyError as exc:
            answer, code = {"error": str(exc.args[0])}, "404 Not Found"
        except (ValueError, TypeError) as exc:
            answer, code = {"error": str(exc)}, "400 Bad Request"
        body = json.dumps(answer).encode()
        start_response(code, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return wrapped
