"""Typed, frozen configuration for a whole run (see schema.py for the groups and the recipe the defaults are).

  schema.py    the dataclasses (one per concern, composed into RunConfig), the Literal choices, ConfigError, the
               spellings a config no longer takes (MOVED, REMOVED, RENAMED_VALUES)
  validate.py  range and cross-field checks: one ConfigError naming every bad key
  load.py      YAML files + dotted overrides through OmegaConf -> a validated RunConfig (an old spelling refused with
               its new one); to_yaml; absolute_paths
"""

from scalerl_jax.config.load import PATH_KEYS, absolute_paths, load_config, to_yaml
from scalerl_jax.config.schema import *  # noqa: F401,F403  (every group dataclass, the Literal types, CHOICES)
from scalerl_jax.config.schema import CHOICES, CONFIG_GROUPS, MOVED, ConfigError, RunConfig
from scalerl_jax.config.validate import validate, validate_with_tokenizer

__all__ = ["CHOICES", "CONFIG_GROUPS", "ConfigError", "MOVED", "PATH_KEYS", "RunConfig", "absolute_paths",
           "load_config", "to_yaml", "validate", "validate_with_tokenizer"]
