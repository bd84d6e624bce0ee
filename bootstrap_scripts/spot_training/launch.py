"""``python -m spot_training.launch [torchrun args]``: torchrun whose TCP stores listen on one address only.

torchrun's c10d rendezvous store (on the rendezvous host) and the shared worker store (on the node of rank 0)
are ``torch.distributed.TCPStore`` servers, and TCPStore binds its server socket to every interface: it has no
bind-address option. TCPStore does accept an already-listening socket (``master_listen_fd``), so this wrapper
binds one to ``SPOT_TRAINING_STORE_BIND_ADDRESS`` (the node's own, possibly mapped, address; set by the node
agent) and hands it over. On a real node that keeps the stores on the VPC address; in single-machine emulation
on a loopback address (127.0.0.x). Without the variable, or on a torch without ``master_listen_fd``, this is
plain torchrun. Gloo/NCCL data sockets are kept on loopback separately (GLOO_SOCKET_IFNAME=lo, set by the agent).

After each rendezvous round it also makes every node use rank 0's store (``share_store``, a torch 2.13 bug) and,
with ``SPOT_TRAINING_WORLD_FILE`` (set by the agent), records the round's nodes there (``record_round``).

And it stops a worker with a signal to the worker alone (``signal_workers_alone``): torchrun signals a worker's
whole process group, whose DataLoader worker processes die of the SIGTERM, so the training process failed at its
next batch instead of saving its emergency checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
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


def after_each_round(world_file: str) -> None:
    """Patch torch's c10d rendezvous handler once: after each round it shares the store (:func:`share_store`)
    and, with ``world_file``, records the round (:func:`record_round`)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    handler = dynamic_rendezvous.DynamicRendezvousHandler
    next_round = handler.next_rendezvous
    seen: set[str] = set()  # every round of this torchrun: a node that joined and left between two agent polls

    def next_rendezvous(self: Any, *args: Any, **kwargs: Any) -> Any:
        info = next_round(self, *args, **kwargs)
        share_store(self, info)
        if world_file:
            record_round(self, world_file, seen)
        return info

    handler.next_rendezvous = next_rendezvous  # type: ignore[method-assign]


def share_store(handler: Any, info: Any) -> None:
    """Make a node that joins a running training (a later rendezvous round) find the shared worker store.

    torch 2.13's c10d handler shares its TCP store with the workers: rank 0 writes the store's address into each
    round's keys (``MASTER_ADDR``, ``MASTER_PORT``) only the first time it builds that information, and a node
    that has it already reuses its own. In a round a node joins later, the new node waits for keys rank 0 never
    writes (``wait timeout after 60000ms, keys: /torch.rendezvous.<job>.1/MASTER_ADDR``), or, when the new node
    takes rank 0, the others keep the old store. So here rank 0 writes the keys after every round and every
    other node reads them."""
    from torch.distributed.elastic.rendezvous import api

    shared = getattr(info, "_bootstrap_store_info", None)
    if shared is None or os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") == "1":
        return
    keys = api.RendezvousStoreInfo
    try:
        if info.rank == 0:  # its own server: the info it kept may name the store of a rank 0 that has left
            current = keys(master_addr=handler._this_node.addr, master_port=handler._shared_tcp_store_server.port)
            info.store.set(keys.MASTER_ADDR_KEY, current.master_addr)
            info.store.set(keys.MASTER_PORT_KEY, str(current.master_port))
        else:  # bounded: the store's read timeout
            current = keys(
                master_addr=info.store.get(keys.MASTER_ADDR_KEY).decode(),
                master_port=int(info.store.get(keys.MASTER_PORT_KEY).decode()),
            )
    except AttributeError as exc:  # another torch's handler (these are its internals): torch's own behaviour
        print(f"spot_training.launch: could not share the rendezvous store ({exc!r})", file=sys.stderr)
        return
    info._bootstrap_store_info = handler._bootstrap_store_info = current


def record_round(handler: Any, path: str, seen: set[str]) -> None:
    """Add the round's node addresses (``--local-addr``) to ``seen`` (the rounds before) and write them to ``path``
    as JSON (``{"addresses": [...]}``, replaced atomically): the node agent learns from it which nodes joined the
    training after it started (torchrun restarts the workers when a node joins). Reads the c10d handler's round
    state, which torch does not make public: if that fails, torchrun runs on and the agent knows only its first
    peers."""
    try:
        seen.update(node.addr for node in handler._state_holder.state.participants)
        with open(path + ".tmp", "w") as f:
            json.dump({"addresses": sorted(seen)}, f)
        os.replace(path + ".tmp", path)
    except (AttributeError, OSError, TypeError) as exc:
        print(f"spot_training.launch: could not record the rendezvous round ({exc!r})", file=sys.stderr)


def signal_workers_alone() -> None:
    """Patch torch's ``SubprocessHandler.close`` once: the stop signal (SIGTERM, on a spot notice, a stop or a
    restart) goes to the worker process alone, not to its process group; SIGKILL, after the shutdown timeout, still
    goes to the group.

    torchrun starts each worker in a session of its own and stops it with ``os.killpg``. A DataLoader's worker
    processes (``num_workers`` > 0) are in that group, and torch's own SIGTERM handler there ends them; the
    training process then raised "DataLoader worker ... killed by signal: Terminated" at its next batch, before the
    checkpoint helper's ``step()`` could save, and everything since the last checkpoint was lost. Alone, the
    training process saves and exits; then what is left in its group is killed (below)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    handler = subprocess_handler.SubprocessHandler
    group_close = handler.close

    def close(self: Any, death_sig: Any = None) -> None:
        stop = death_sig or signal.SIGTERM
        proc, files = getattr(self, "proc", None), (getattr(self, "_stdout", None), getattr(self, "_stderr", None))
        if stop == signal.SIGKILL or proc is None:  # another torch's handler (these are its internals): its own way
            return group_close(self, death_sig)
        if proc.poll() is None:
            proc.send_signal(stop)
        for f in files:
            if f is not None:
                f.close()

    handler.close = close  # type: ignore[method-assign]

    # Once torch has closed the workers (saved and exited, or killed after the timeout), what they started is ended
    # too, as the group signal did: a process a script started (an evaluation, a metrics server) would otherwise run
    # on beside the next attempt's trainer, holding its GPU memory and ports.
    from torch.distributed.elastic.multiprocessing import api

    context = api.SubprocessContext
    torch_close = context._close

    def close_groups(self: Any, death_sig: Any, timeout: int = 30) -> None:
        torch_close(self, death_sig, timeout)
        for worker in getattr(self, "subprocess_handlers", {}).values():
            pid = getattr(getattr(worker, "proc", None), "pid", None)
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):  # nothing left in its group
                    pass

    context._close = close_groups  # type: ignore[method-assign]


def main() -> None:
    after_each_round(os.environ.get("SPOT_TRAINING_WORLD_FILE", ""))
    signal_workers_alone()
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
