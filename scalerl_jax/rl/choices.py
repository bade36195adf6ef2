"""One check for every name-valued loss key; the options live in `scalerl_jax.config.CHOICES`."""

from __future__ import annotations

from scalerl_jax.config import CHOICES


def check_choice(key: str, value: str) -> str:
  """Returns `value` if it is one of `CHOICES[key]`, else raises a ValueError that names the dotted key.

  `config.validate` checks the same names at load time; this check also covers configs built in code.
  """
  options = CHOICES[key]
  if value not in options:
    raise ValueError(f"{key}: unknown {value!r}; choose one of {', '.join(options)}")
  return value
