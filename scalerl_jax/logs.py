"""Logging for the entry points: this package's INFO lines, only warnings and errors from everyone else.

Third-party libraries log routine events at INFO (jax: "Unable to initialize backend 'tpu': ... libtpu.so" on
every CPU machine; orbax: every checkpoint step; grain), which read like errors to a newcomer. `setup_logging`
keeps the root logger at WARNING and the `scalerl_jax` loggers at INFO; `verbose=True`, or the environment
variable SCALERL_VERBOSE=1, shows everyone's INFO lines (and XLA's C++ INFO logs) again.

Progress: `progress_bar` is a tqdm bar on a terminal and a few plain log lines when stderr goes to a file.
"""

import logging
import os
import sys
from typing import Optional

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
VERBOSE_ENV = "SCALERL_VERBOSE"


def setup_logging(verbose: bool = False) -> None:
  """Configures logging once per process; call it before importing jax (XLA reads TF_CPP_MIN_LOG_LEVEL then)."""
  verbose = verbose or os.environ.get(VERBOSE_ENV, "") not in ("", "0")
  logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=FORMAT)
  logging.getLogger("scalerl_jax").setLevel(logging.INFO)
  # orbax and grain log through absl's "absl" logger, which absl re-levels whenever its flags are parsed
  logging.getLogger("absl").setLevel(logging.INFO if verbose else logging.WARNING)
  if not verbose:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA / TSL C++ logs: warnings and errors only


class _Lines:
  """A progress bar's plain stand-in for a log file: one log line per tenth of the total (and at the end), no
  carriage returns. tqdm's in-place redraws, written to a file, pile up as one line of thousands of `\\r` frames."""

  def __init__(self, total: int, desc: str, unit: str, initial: int):
    self.total, self.desc, self.unit, self.n = total, desc, unit, initial
    self._every = max(total // 10, 1)
    self._logged = initial
    self._postfix = ""

  def update(self, n: int = 1) -> None:
    self.n += n
    if self.n - self._logged >= self._every:
      self._log()

  def set_postfix(self, values: Optional[dict] = None, **kwargs) -> None:
    self._postfix = ", ".join(f"{k}={v}" for k, v in {**(values or {}), **kwargs}.items())

  def set_postfix_str(self, text: str) -> None:
    self._postfix = text

  def _log(self) -> None:
    self._logged = self.n
    logging.getLogger("scalerl_jax.progress").info(
        "%s: %d/%d %ss%s", self.desc, self.n, self.total, self.unit, f" ({self._postfix})" if self._postfix else "")

  def close(self) -> None:
    if self.n != self._logged:
      self._log()


def progress_bar(total: int, desc: str, unit: str, initial: int = 0, leave: bool = True):
  """A tqdm bar when stderr is a terminal; else plain log lines (`_Lines`), so a log file holds no `\\r` frames."""
  if not sys.stderr.isatty():
    return _Lines(total, desc, unit, initial)
  from tqdm.auto import tqdm
  return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=leave)
