"""Weight-sync transport between two local processes: how long a disaggregated sync and a colocated gather take.

  python benchmarks/multihost_transfer.py [--sizes-mb 1 16 64 256] [--reps 5]

Starts two processes (jax.distributed on localhost, 4 CPU devices each, gloo) that run, for each size, interleaved:
  * channel: `distributed.Channel` (jax.experimental.transfer) from process 0's first device to process 1's, a
    tree of 8 float32 arrays of that total size (timed on the receiver: header wait excluded, pull included);
  * gather: `distributed.replicate_fn` on a mesh over both processes' 8 devices, the same tree sharded over all of
    them, gathered to replicated (the colocated weight sync's collective).
Prints medians (and MB/s) and writes benchmarks/results/multihost_transfer.json (date, machine, command).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def worker(pid: int, port: int, sizes_mb: list[float], reps: int) -> None:
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  from scalerl_jax import distributed

  distributed.initialize(f"127.0.0.1:{port}", 2, pid, heartbeat_timeout_s=60)
  channel = distributed.Channel("127.0.0.1", prefix="bench")
  mesh = Mesh(np.array(jax.devices()), ("d",))
  out = {"channel_s": {}, "gather_s": {}}
  for mb in sizes_mb:
    n = int(mb * 2**20 / 4 / 8) // 8 * 8
    tree = [np.full((n,), i, np.float32) for i in range(8)]
    sharded = [jax.make_array_from_callback((n,), NamedSharding(mesh, P("d")), lambda idx, x=x: x[idx]) for x in tree]
    chan, gath = [], []
    for _ in range(reps + 1):  # the first round warms up (compilation, connections)
      if pid == 0:
        channel.send(1, "w", tree)
      else:
        got = channel.recv(0, "w")
        assert float(np.asarray(got[3])[0]) == 3.0
        chan.append(channel.last["seconds"])
      distributed.barrier(f"bench/{mb}/{len(gath)}")
      import time
      t0 = time.perf_counter()
      jax.block_until_ready(distributed.replicate_fn(mesh)(sharded))
      gath.append(time.perf_counter() - t0)
    out["channel_s"][f"{mb:g}"], out["gather_s"][f"{mb:g}"] = chan[1:], gath[1:]
  if pid == 1:
    print("RESULT " + json.dumps(out), flush=True)
  distributed.barrier("bench/end")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64, 256])
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--out", default=str(HERE / "results" / "multihost_transfer.json"))
  ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
  ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker is not None:
    return worker(args.worker, args.port, args.sizes_mb, args.reps)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
  cmd = [sys.executable, __file__, "--port", str(port), "--reps", str(args.reps), "--sizes-mb",
         *map(str, args.sizes_mb)]
  procs = [subprocess.Popen([*cmd, "--worker", str(i)], env=env, stdout=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = [p.communicate(timeout=1800)[0] for p in procs]
  line = next(l for l in outs[1].splitlines() if l.startswith("RESULT "))
  res = json.loads(line[len("RESULT "):])
  rows = []
  print(f"{'MB':>7} {'channel s':>10} {'MB/s':>8} {'gather s':>10} {'MB/s':>8}")
  for mb in (f"{float(m):g}" for m in args.sizes_mb):
    c, g = statistics.median(res["channel_s"][mb]), statistics.median(res["gather_s"][mb])
    rows.append({"mb": float(mb), "channel_s_median": c, "gather_s_median": g,
                 "channel_mb_per_s": float(mb) / c, "gather_mb_per_s": float(mb) / g})
    print(f"{float(mb):7.0f} {c:10.4f} {float(mb) / c:8.0f} {g:10.4f} {float(mb) / g:8.0f}")
  sys.path.insert(0, str(HERE))
  from record import save_result

  save_result(args.out, {"config": {"sizes_mb": args.sizes_mb, "reps": args.reps}, "results": rows, "raw": res})


if __name__ == "__main__":
  main()
