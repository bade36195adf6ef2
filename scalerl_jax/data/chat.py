"""A checkpoint's Jinja chat template, rendered as transformers' `apply_chat_template` renders it.

The template comes from `chat_template.jinja` in the checkpoint directory (transformers 5 saves it there; it wins
when both exist) or from `tokenizer_config.json`'s `chat_template` (a string, or a list of {name, template} whose
"default" entry is used). It is compiled in jinja2's immutable sandbox with trim_blocks and lstrip_blocks and the
loopcontrols extension ({% break %} / {% continue %}), with the helpers templates expect: `raise_exception(msg)`,
a `tojson` filter that keeps non-ASCII text (ensure_ascii=False, indent / separators / sort_keys) and
`strftime_now(fmt)` (local time, as transformers). Rendering passes `messages`, `add_generation_prompt` and the
tokenizer's special token strings (`bos_token`, `eos_token`, `pad_token`, `unk_token`; an absent one is jinja's
undefined, which renders as ''). Every failure is a DataError naming the file and jinja's message.
"""

from __future__ import annotations

import datetime
import json
import pathlib
from typing import Any, Mapping, Optional, Sequence

from scalerl_jax.data.sources import DataError

TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def token_text(value: Any) -> Optional[str]:
  """A tokenizer_config.json special token: a string, an AddedToken dict ({"content": ...}) or null."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


def _raise_exception(message):
  import jinja2
  raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
  return datetime.datetime.now().strftime(fmt)


def _jinja_reason(exc: Exception) -> str:
  line = getattr(exc, "lineno", None)
  text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
  return f"{type(exc).__name__}{f' at line {line}' if line else ''}: {text}"


class ChatTemplate:
  """A compiled chat template. `where` (the file it came from) prefixes every error."""

  def __init__(self, source: str, where: str, special_tokens: Optional[Mapping[str, str]] = None):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    self.source, self.where = source, where
    self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)}
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
      self._template = env.from_string(source)
    except jinja2.TemplateError as exc:
      raise DataError(f"{where}: the chat template does not compile ({_jinja_reason(exc)})") from None

  def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs) -> str:
    """The conversation as text; with `add_generation_prompt`, ending in the assistant turn's header."""
    try:
      return self._template.render(**{**self.special_tokens, **kwargs}, messages=[dict(m) for m in messages],
                                   add_generation_prompt=bool(add_generation_prompt))
    except Exception as exc:  # TemplateError (raise_exception, undefined access), and Python errors inside it
      raise DataError(f"{self.where}: the chat template failed to render ({_jinja_reason(exc)})") from None

  def render_prompt(self, text: str) -> str:
    """A data-set prompt as one user turn, followed by the generation prompt."""
    return self.render([{"role": "user", "content": text}], add_generation_prompt=True)


def _template_source(value: Any, where: pathlib.Path) -> Optional[str]:
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, list):  # named templates: [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
    named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
    if isinstance(named.get("default"), str):
      return named["default"]
    raise DataError(f"{where}: chat_template is a list without a 'default' template (names: "
                    f"{sorted(map(str, named))})")
  raise DataError(f"{where}: chat_template must be a string or a list of named templates, got "
                  f"{type(value).__name__}")


def load_chat_template(directory: str | pathlib.Path, tokenizer_config: Mapping[str, Any]
                       ) -> Optional[ChatTemplate]:
  """The checkpoint's template (chat_template.jinja, else tokenizer_config.json's), or None when it has none."""
  d = pathlib.Path(directory)
  jinja_file, config_file = d / TEMPLATE_FILE, d / "tokenizer_config.json"
  specials = {k: token_text(tokenizer_config.get(k)) for k in SPECIAL_TOKEN_KEYS}
  if jinja_file.is_file():
    try:
      source = jinja_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
      raise DataError(f"{jinja_file}: not a readable chat template ({exc})") from None
    return ChatTemplate(source, str(jinja_file), specials)
  source = _template_source(tokenizer_config.get("chat_template"), config_file)
  return None if source is None else ChatTemplate(source, str(config_file), specials)
