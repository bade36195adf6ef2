"""Reviewed snapshots of every shipped config, fully resolved: tests/snapshots/configs/<name>.yaml is
`config.to_yaml(load_config("configs/<name>.yaml"))`, so it shows every key of the run, defaults included.

    python -m tests.snapshots.refresh            # rewrite the snapshots (on purpose), then review `git diff tests/snapshots`
    python -m tests.snapshots.refresh --check    # print what differs, write nothing (exit 1 if anything does)

tests/test_config_recipes.py fails with the same diff when a shipped YAML, or a code default it relies on, drifts
from its snapshot.
"""

from __future__ import annotations

import argparse
import difflib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
SNAPSHOTS = pathlib.Path(__file__).resolve().parent / "configs"
COMMAND = "python -m tests.snapshots.refresh"


def shipped() -> list[pathlib.Path]:
  return sorted(CONFIGS.glob("*.yaml"))


def resolved(path: pathlib.Path) -> str:
  from scalerl_jax.config import load_config, to_yaml
  return to_yaml(load_config(path))


def snapshot_of(path: pathlib.Path) -> pathlib.Path:
  return SNAPSHOTS / path.name


def _show(path: pathlib.Path) -> str:
  return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def drift(path: pathlib.Path, snap: pathlib.Path | None = None) -> str:
  """'' when configs/<name>.yaml resolves to its snapshot, else a unified diff (snapshot -> now)."""
  snap = snapshot_of(path) if snap is None else snap
  if not snap.is_file():
    return f"{_show(snap)} does not exist: review {_show(path)}, then run {COMMAND}"
  want, got = snap.read_text(), resolved(path)
  if want == got:
    return ""
  lines = difflib.unified_diff(want.splitlines(keepends=True), got.splitlines(keepends=True),
                               f"{_show(snap)} (reviewed)", f"{_show(path)} (resolved now)")
  return "".join(lines) + f"\nIf the change is intended, run {COMMAND} and commit the reviewed snapshot."


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--check", action="store_true", help="print the diffs, write nothing")
  args = ap.parse_args(argv)
  changed = 0
  SNAPSHOTS.mkdir(parents=True, exist_ok=True)
  for path in shipped():
    diff = drift(path)
    if not diff:
      continue
    changed += 1
    print(diff if args.check else f"wrote {_show(snapshot_of(path))}")
    if not args.check:
      snapshot_of(path).write_text(resolved(path))
  names = {p.name for p in shipped()}
  for stale in sorted(p for p in SNAPSHOTS.glob("*.yaml") if p.name not in names):
    changed += 1
    print(f"{_show(stale)}: no configs/{stale.name} any more" + ("" if args.check else "; removed"))
    if not args.check:
      stale.unlink()
  print(f"{changed} snapshot(s) {'differ' if args.check else 'rewritten'}, {len(names)} shipped config(s)")
  return 1 if args.check and changed else 0


if __name__ == "__main__":
  sys.exit(main())
