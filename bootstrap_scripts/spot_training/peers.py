"""Which node hosts the rendezvous: one order of a group's instances that every node (and the emulator) agrees on.

Oldest launch first, then instance id. A replacement is always launched after the nodes that survived, so it
never takes the host's place: a survivor that restarted alone (``min_nodes`` < ``max_nodes``) keeps hosting, and
the replacement joins that rendezvous instead of hosting a second training on the same checkpoint prefix (which
the lowest instance id did whenever the replacement's id sorted first). Python 3.8+, stdlib only.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List


def launch_order(instances: Iterable[Dict[str, Any]]) -> List[str]:
    """Instance ids of EC2 ``describe_instances`` entries, oldest ``LaunchTime`` first, then by id: element 0
    hosts the rendezvous."""
    return [i["InstanceId"] for i in sorted(instances, key=lambda i: (i["LaunchTime"], i["InstanceId"]))]
