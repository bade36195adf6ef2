"""Where a benchmark result came from, and writing it: every results/*.json carries the date, the command and the
machine (with its load average: other jobs on the same cores slow every number)."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import sys


def save_result(out: str | pathlib.Path, result: dict) -> pathlib.Path:
  """Writes {date, command, machine, **result} as JSON to `out` (folders created) and says where."""
  record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([pathlib.Path(sys.executable).name] + sys.argv),
            "machine": {**platform.uname()._asdict(), "cpu_count": os.cpu_count(),
                        "load_average_1min_at_save": os.getloadavg()[0]},
            **result}
  path = pathlib.Path(out)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(record, indent=2) + "\n")
  print(f"wrote {path}")
  return path
