"""``python -m spot_training.launch [torchrun args]``: torchrun whose TCP stores listen on one address only.

torchrun's c10d rendezvous store (on the rendezvous host) and the shared worker store (on the node of rank 0)
are ``torch.distributed.TCPStore`` servers, and TCPStore binds its server socket to every interface: it has no
bind-address option. TCPStore does accept an already-listening socket (``master_listen_fd``), so this wrapper
binds one to ``SPOT_TRAINING_STORE_BIND_ADDRESS`` (the node's own, possibly mapped, address; set by the node
agent) and hands it over. On a real node that keeps the stores on the VPC address; in single-machine emulation
on a loopback address (127.0.0.x). Without the variable, or on a torch without ``master_listen_fd``, this is
plain torchrun. Gloo/NCCL data sockets are kept on loopback separately (GLOO_SOCKET_IFNAME=lo, set by the agent).
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any


def _bound_store_class(address: str) -> Any:
    import torch.distributed as dist

    base = dist.TCPStore
    if "master_listen_fd" not in (base.__init__.__doc__ or ""):
        return None

    class BoundTCPStore(base):  # type: ignore[misc, valid-type]
        def __init__(self, host_name: str, port: int, *args: Any, **kwargs: Any) -> None:
            names = ["world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant", "master_listen_fd"]
            kwargs.update(dict(zip(names, args)))  # noqa: B905 - positional args are a prefix of names
            if kwargs.get("is_master") and kwargs.get("master_listen_fd") is None:
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, int(port)))
                sock.listen(128)
                port = sock.getsockname()[1]
                kwargs["master_listen_fd"] = sock.detach()  # TCPStore owns the descriptor from here on
            super().__init__(host_name, port, **kwargs)

    return BoundTCPStore


def install(address: str) -> bool:
    """Make torchrun's rendezvous modules create their store servers on ``address``; True when installed."""
    store_class = _bound_store_class(address)
    if store_class is None:
        return False
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    c10d_rendezvous_backend.TCPStore = store_class  # type: ignore[misc]
    dist.TCPStore = store_class  # type: ignore[misc]  # dynamic_rendezvous creates the shared store via dist.*
    return True


def main() -> None:
    address = os.environ.get("SPOT_TRAINING_STORE_BIND_ADDRESS", "")
    if address and not install(address):
        print(
            "spot_training.launch: this torch has no TCPStore(master_listen_fd); stores bind to all interfaces",
            file=sys.stderr,
        )
    from torch.distributed.run import main as torchrun_main

    torchrun_main()


if __name__ == "__main__":
    main()
