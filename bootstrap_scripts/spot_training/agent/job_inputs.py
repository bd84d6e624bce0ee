"""The job's data inputs: each ``{s3, path}`` brought up to date before the trainer starts, by difference, with the
agent's parallel ranged GETs (``checkpoint_download.in_parallel`` and ``CheckpointDownload.get_range``).

Each input's files live in a store directory: ``<warm volume>/inputs/<sha256 of the s3 URL>`` on a node with a
claimed warm volume (the next node claiming it finds them), else ``<work dir>/inputs/<...>``; the job's ``path``
(under the node root) is a symbolic link to it. Beside the store, ``<store>.json`` records each file's ETag and size
as S3 listed them when it was fetched. An object listed with the recorded ETag and size, its file present at that
size, is kept; others leave the record, are fetched (to ``<file>.part``, renamed once whole and checked), and join
it once every file is in place; files S3 no longer lists are removed.

A fetched object is checked for its size and, when its ETag is an MD5 (a single-part upload), for the MD5 of its
content; a multipart or SSE-KMS object's ETag is no MD5 of its content, and is checked for its size only."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from spot_training.agent.aws_config import TRANSFER
from spot_training.agent.checkpoint_download import CheckpointDownload, in_parallel
from spot_training.agent.errors import AWS_ERRORS, AgentError
from spot_training.job_parts import split_s3_url

PLAIN_ETAG = re.compile(r'^"?([0-9a-f]{32})"?$')
PART = ".part"
RECORD = ".json"  # beside a store: the ETag and size of each of its files (``<store>.json``)
STORES = "inputs"  # the folder of the input stores, on the warm volume or in the work directory
Listing = Dict[str, Tuple[str, int]]  # file (relative) -> (ETag, size)
Range = Tuple[str, str, int, int]  # (key, file path, start, length)


def listing(s3: Any, bucket: str, prefix: str) -> Listing:
    """The objects under ``prefix`` (a folder: ends with "/" unless empty), by their path below it."""
    found: Listing = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            rel = item["Key"][len(prefix) :]
            parts = rel.split("/")
            if not rel or rel.endswith("/") or "" in parts or ".." in parts or "." in parts:
                continue  # a folder marker, or a name that is no relative path
            found[rel] = (str(item["ETag"]), int(item["Size"]))
    return found


def read_state(path: str) -> Listing:
    try:
        with open(path) as f:
            return {rel: (str(v[0]), int(v[1])) for rel, v in json.load(f).items()}
    except (OSError, ValueError, TypeError, IndexError, AttributeError):
        return {}


def write_state(path: str, files: Listing) -> None:
    """Record ``files`` (ETag and size of each) in ``path``, replaced whole."""
    with open(path + PART, "w") as f:
        json.dump({rel: list(meta) for rel, meta in files.items()}, f)
    os.replace(path + PART, path)


def md5_file(path: str) -> str:
    h = hashlib.md5()  # noqa: S324 - S3's ETag of a single-part upload, not a security check
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            h.update(chunk)
    return h.hexdigest()


class InputSync:
    """One input brought up to date in its store (``sync``); ``fetched``/``kept``/``removed`` count the files."""

    def __init__(self, s3: Any, url: str, store: str, interrupt: Callable[[], None]) -> None:
        where = split_s3_url(url)
        if where is None:
            raise AgentError(f"input {url!r} is not s3://bucket/prefix")
        self.s3, self.url, self.store, self.interrupt = s3, url, store, interrupt
        self.bucket, prefix = where
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.download = CheckpointDownload(s3, self.bucket, "", "")
        self.fetched = self.kept = self.removed = 0

    def sync(self) -> None:
        try:
            wanted = listing(self.s3, self.bucket, self.prefix)
        except AWS_ERRORS as exc:
            raise AgentError(f"input {self.url}: cannot list it ({exc})") from None
        state_file = self.store.rstrip("/") + RECORD
        had = read_state(state_file)
        os.makedirs(self.store, exist_ok=True)
        self.removed = self.remove_unlisted(set(wanted))
        fetch = [rel for rel, meta in wanted.items() if not self.current(rel, meta, had.get(rel))]
        self.kept = len(wanted) - len(fetch)
        # the files about to change leave the record first: one cut off mid-way is never taken for a kept one
        write_state(state_file, {rel: meta for rel, meta in wanted.items() if rel not in set(fetch)})
        self.fetch(fetch, wanted)
        self.fetched = len(fetch)
        write_state(state_file, wanted)

    def current(self, rel: str, meta: Tuple[str, int], recorded: Optional[Tuple[str, int]]) -> bool:
        path = os.path.join(self.store, rel)
        return recorded == meta and os.path.isfile(path) and os.path.getsize(path) == meta[1]

    def remove_unlisted(self, wanted: "set[str]") -> int:
        """Remove the store's files S3 no longer lists (and partial downloads); how many listed files went."""
        removed = 0
        for folder, _, names in os.walk(self.store):
            for name in names:
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, self.store)
                if rel not in wanted:
                    os.remove(path)
                    removed += 0 if name.endswith(PART) else 1
        return removed

    def fetch(self, rels: List[str], wanted: Listing) -> None:
        """Fetch ``rels`` in ranges of ``TRANSFER.multipart_chunksize``, all in parallel, then check each file."""
        ranges: List[Range] = []
        for rel in rels:
            path = os.path.join(self.store, rel) + PART
            os.makedirs(os.path.dirname(path), exist_ok=True)
            size = wanted[rel][1]
            with open(path, "wb") as f:
                f.truncate(size)
            chunk = TRANSFER.multipart_chunksize
            ranges += [(self.prefix + rel, path, start, min(chunk, size - start)) for start in range(0, size, chunk)]
        in_parallel(ranges, self.get_range, self.interrupt)
        for rel in rels:
            path = os.path.join(self.store, rel)
            self.check(rel, path + PART, wanted[rel])
            os.replace(path + PART, path)

    def get_range(self, part: Range, abandoned: threading.Event) -> None:
        key, path, start, length = part
        try:
            got = self.download.get_range(key, path, start, length, abandoned)
        except (*AWS_ERRORS, AgentError) as exc:
            raise AgentError(f"input {self.url}: cannot fetch {key}: {exc}") from None
        if got is None and not abandoned.is_set():
            raise AgentError(f"input {self.url}: {key} is shorter than listed (changed while fetched?)")

    def check(self, rel: str, path: str, meta: Tuple[str, int]) -> None:
        etag, size = meta
        plain = PLAIN_ETAG.match(etag)
        if os.path.getsize(path) != size:
            raise AgentError(f"input {self.url}: {rel} has {os.path.getsize(path)} bytes, S3 listed {size}")
        if plain and md5_file(path) != plain.group(1) and not self.kms_encrypted(self.prefix + rel):
            raise AgentError(f"input {self.url}: {rel} fails its MD5 check against its ETag")

    def kms_encrypted(self, key: str) -> bool:
        """Whether S3 encrypts the object with KMS (its ETag is then no MD5 of its content)."""
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=key)
        except AWS_ERRORS:
            return False
        return str(head.get("ServerSideEncryption", "")).startswith("aws:kms") or "SSECustomerAlgorithm" in head


def store_dir(url: str, volume_dir: Optional[str], work_dir: str) -> str:
    """Where input ``url``'s files live on this node (see the module's docstring)."""
    name = hashlib.sha256(url.encode()).hexdigest()[:32]
    return os.path.join(volume_dir if volume_dir is not None else work_dir, STORES, name)


def place(path: str, store: str) -> None:
    """Make ``path`` a symbolic link to ``store``, replacing a link to another input store; anything else there (a
    directory, a file, a link the agent did not make) is refused."""
    if os.path.islink(path):
        target = os.readlink(path)
        if target == store:
            return
        if os.path.basename(os.path.dirname(target)) != STORES:
            raise AgentError(
                f"input path {path} is a link on this node that the agent did not make; choose another path"
            )
        os.remove(path)
    elif os.path.exists(path):
        raise AgentError(f"input path {path} exists on this node and is no link the agent made; choose another path")
    os.makedirs(os.path.dirname(path.rstrip("/")) or "/", exist_ok=True)
    os.symlink(store, path.rstrip("/"))


def sync_inputs(
    s3: Any,
    inputs: List[Dict[str, str]],
    node_root: str,
    volume_dir: Optional[str],
    work_dir: str,
    log: Any,
    interrupt: Callable[[], None],
) -> None:
    """Bring every input up to date and link its path to it; a log line per input says what it took."""
    where = "on the warm volume" if volume_dir is not None else "on this node"
    for entry in inputs:
        store = store_dir(entry["s3"], volume_dir, work_dir)
        sync = InputSync(s3, entry["s3"], store, interrupt)
        sync.sync()
        place(node_root + entry["path"], store)
        log(
            f"input {entry['s3']} -> {entry['path']}: {sync.fetched} object(s) fetched, {sync.kept} kept {where}, "
            f"{sync.removed} removed"
        )
