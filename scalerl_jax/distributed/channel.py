"""Messages between processes (disaggregated runs): point-to-point transfers of trees of arrays between two
processes' first devices.

Each process runs a `jax.experimental.transfer` server, bound to the host its caller gives (`--transfer-host`, else
`default_transfer_host()`); the sender schedules a message under its id, the receiver pulls it. Each message's
header (id, shapes, dtypes) goes through the key-value store, so the receiver waits for a sender that is still busy
in bounded polls that also watch the abort and stop records (`keys.wait_for_key`).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import time
from typing import Any

import jax
import numpy as np

from scalerl_jax.distributed.keys import _client, wait_for_key


class Channel:
  """Ordered point-to-point messages between processes: `send(dst, tag, tree)` / `recv(src, tag)` with trees of
  numpy or jax arrays (`send_obj` / `recv_obj`: any picklable object). Both sides call in the same order per
  (src, dst, tag); other processes take no part. Each process runs a `jax.experimental.transfer` server on `host`
  (the address other processes reach this one at): the sender schedules its arrays under a message id
  (`await_pull`) and writes the header (id, shapes, dtypes) to the key-value store; the receiver waits for the
  header in bounded polls and pulls. `last` holds the latest message's bytes and seconds (the receiver's seconds
  include the transfer; the sender's only the scheduling)."""

  def __init__(self, host: str, prefix: str = "scalerl_jax/msg"):
    from jax.experimental import transfer

    self.prefix = prefix
    self._seq: dict[tuple[int, int, str], int] = {}
    self._device = jax.local_devices()[0]
    self._server = transfer.start_transfer_server(self._device.client, f"{host}:0", [f"{host}:0"])
    self._connections: dict[int, Any] = {}
    _client().key_value_set(f"{prefix}/address/{jax.process_index()}", self._server.address())
    self.last = {"bytes": 0, "seconds": 0.0}

  def _key(self, src: int, dst: int, tag: str) -> tuple[str, int]:
    n = self._seq.get((src, dst, tag), 0)
    self._seq[(src, dst, tag)] = n + 1
    key = f"{self.prefix}/{src}-{dst}/{tag}/{n}"
    return key, int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "big")

  def send(self, dst: int, tag: str, tree: Any) -> None:
    key, uuid = self._key(jax.process_index(), dst, tag)
    t0 = time.perf_counter()
    leaves = [jax.device_put(x, self._device) for x in jax.tree.leaves(tree)]
    self._server.await_pull(uuid, leaves)
    header = {"uuid": uuid, "shapes": [list(x.shape) for x in leaves], "dtypes": [str(x.dtype) for x in leaves]}
    _client().key_value_set(key, json.dumps(header))
    self.last = {"bytes": int(sum(x.nbytes for x in leaves)), "seconds": time.perf_counter() - t0}

  def recv(self, src: int, tag: str) -> list:
    """The leaves of the message, as arrays on this process's first device."""
    from jax.sharding import SingleDeviceSharding

    key, _ = self._key(src, jax.process_index(), tag)
    header = json.loads(wait_for_key(key))
    t0 = time.perf_counter()
    if src not in self._connections:
      self._connections[src] = self._server.connect(wait_for_key(f"{self.prefix}/address/{src}"))
    specs = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d), sharding=SingleDeviceSharding(self._device))
             for s, d in zip(header["shapes"], header["dtypes"])]
    out = jax.block_until_ready(self._connections[src].pull(header["uuid"], specs)) if specs else []
    _client().key_value_delete(key)
    self.last = {"bytes": int(sum(x.nbytes for x in out)), "seconds": time.perf_counter() - t0}
    return list(out)

  def send_obj(self, dst: int, tag: str, obj: Any) -> None:
    self.send(dst, tag, [np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)])

  def recv_obj(self, src: int, tag: str) -> Any:
    (blob,) = self.recv(src, tag)
    return pickle.loads(np.asarray(blob).tobytes())


def default_transfer_host() -> str:
  """The address other processes reach this one at when the caller names none (no --transfer-host): this host's
  address on the route to the coordinator (127.0.0.1 when the coordinator is local). Call after `initialize`."""
  import socket

  from jax._src import distributed as jax_distributed

  host = (jax_distributed.global_state.coordinator_address or "127.0.0.1:0").rsplit(":", 1)[0].strip("[]")
  if host in ("localhost", "127.0.0.1", "::1"):
    return "127.0.0.1"
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent: the route's own address
    probe.connect((host, 9))
    return probe.getsockname()[0]
