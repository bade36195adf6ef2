"""Logging for the entry points: this package's INFO lines, only warnings and errors from everyone else.

Third-party libraries log routine events at INFO (jax: "Unable to initialize backend 'tpu': ... libtpu.so" on
every CPU machine; orbax: every checkpoint step; grain), which read like errors to a newcomer. `setup_logging`
keeps the root logger at WARNING and the `scalerl_jax` loggers at INFO; `verbose=True`, or the environment
variable SCALERL_VERBOSE=1, shows everyone's INFO lines (and XLA's C++ INFO logs) again.
"""

import logging
import os

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
