"""spot_training.launch's fix of torch's store sharing (``share_store``), which reads torch internals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from spot_training.launch import share_store
from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo


class Store:
    """The calls share_store makes on the round's store."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.keys[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.keys[key]


def test_rank_0_writes_its_own_store_and_another_node_reads_it() -> None:
    store, old = Store(), RendezvousStoreInfo("10.0.0.9", 1111)  # the store of a rank 0 that has left
    handler = SimpleNamespace(
        _this_node=SimpleNamespace(addr="10.0.0.5"), _shared_tcp_store_server=SimpleNamespace(port=2222)
    )
    first = SimpleNamespace(rank=0, store=store, _bootstrap_store_info=old)
    share_store(handler, first)
    assert first._bootstrap_store_info == RendezvousStoreInfo("10.0.0.5", 2222)
    other_handler = SimpleNamespace(_bootstrap_store_info=old)
    other = SimpleNamespace(rank=1, store=store, _bootstrap_store_info=old)
    share_store(other_handler, other)
    assert other._bootstrap_store_info == other_handler._bootstrap_store_info == RendezvousStoreInfo("10.0.0.5", 2222)


def test_a_handler_without_the_internals_it_reads_leaves_torchs_own_behaviour(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another torch (the default DLAMI's is older than 2.13) whose handler has no ``_shared_tcp_store_server``:
    before, the AttributeError ended torchrun at every round; now the round goes on with torch's store info."""
    old = RendezvousStoreInfo("10.0.0.9", 1111)
    info = SimpleNamespace(rank=0, store=Store(), _bootstrap_store_info=old)
    share_store(SimpleNamespace(_this_node=SimpleNamespace(addr="10.0.0.5")), info)
    assert info._bootstrap_store_info is old
    assert capsys.readouterr().err.startswith(
        "spot_training.launch: could not share the rendezvous store (AttributeError("
    )
