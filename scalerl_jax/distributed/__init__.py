"""Many processes, one run: start-up, roles, host-local <-> global arrays, and the messages between processes.

  keys.py         the coordination service's key-value store: the abort and stop records, bounded waits for a key
                  (wait_for_key, Stopped), barrier
  cluster.py      start-up (initialize), failure (abort, Watchdog), the same config and code on every process
                  (code_version, check_same_everywhere), DistributedError
  topology.py     roles: who trains, who generates (Topology), and their devices (split_for)
  collectives.py  host data -> global arrays (from_global), global -> host (to_host), gathers among any processes
                  (allgather, gather_json, replicate_fn)
  channel.py      point-to-point messages between processes (Channel, jax.experimental.transfer) on a host the
                  caller gives (default_transfer_host when none is named)
"""

from scalerl_jax.distributed.channel import Channel, default_transfer_host
from scalerl_jax.distributed.cluster import (DistributedError, Watchdog, abort, check_same_everywhere, code_version,
                                             detected_process_count, initialize)
from scalerl_jax.distributed.collectives import allgather, from_global, gather_json, replicate_fn, to_host
from scalerl_jax.distributed.keys import (ABORT_KEY, STOP_KEY, Stopped, aborted, barrier, request_stop, stop_requested,
                                          wait_for_key)
from scalerl_jax.distributed.topology import Topology, split_for

__all__ = ["ABORT_KEY", "Channel", "DistributedError", "STOP_KEY", "Stopped", "Topology", "Watchdog", "abort",
           "aborted", "allgather", "barrier", "check_same_everywhere", "code_version", "default_transfer_host",
           "detected_process_count", "from_global", "gather_json", "initialize", "replicate_fn", "request_stop",
           "split_for", "stop_requested", "to_host", "wait_for_key"]
