"""Tokenizers: a character-level one for the built-in tasks and a wrapper over HF `tokenizers` (tokenizer.json).

Both expose one interface: `pad_id`, `bos_id` (None when the model has no BOS), `eos_id`, `vocab_size`,
`encode(str) -> list[int]`, `decode(ids) -> str`, `token_id(token) -> int` and `encode_prompt(str) -> list[int]`,
which applies the chat template and prepends BOS. A chat template is a plain format string in which `{prompt}` is
replaced by the prompt text (e.g. "<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n"); no jinja.

Character vocabulary (24 ids, shared by every built-in task; the model's vocab_size of 32 leaves room):

    0 PAD   1 BOS   2..11 '0'..'9'   12 '+'  13 '-'  14 '*'  15 '/'  16 '='  17 '|'  18 '$'  19 ','  20 '>'
    21 ':'  22 '('  23 ')'

'$' is EOS and '|' the end-of-thinking marker (rollout.interruption.end_marker / phrase). PAD and BOS decode to ''.
"""

from __future__ import annotations

import pathlib
from typing import Optional, Sequence

from scalerl_jax.data.sources import DataError

END_MARKER = "|"  # end of thinking in the built-in tasks' completions
EOS_CHAR = "$"
CHARS = "0123456789+-*/=|$,>:()"


def apply_template(template: str, prompt: str) -> str:
  """`{prompt}` in `template` replaced by `prompt`; an empty template is the identity."""
  return template.replace("{prompt}", prompt) if template else prompt


class CharTokenizer:
  """One id per character of CHARS, after PAD = 0 and BOS = 1."""

  pad_id = 0
  bos_id = 1

  def __init__(self, chat_template: str = ""):
    self.chat_template = chat_template
    self._ids = {c: i + 2 for i, c in enumerate(CHARS)}
    self._chars = ["", ""] + list(CHARS)
    self.eos_id = self._ids[EOS_CHAR]
    self.vocab_size = len(self._chars)

  def token_id(self, char: str) -> int:
    if char not in self._ids:
      raise DataError(f"character {char!r} is not in the built-in vocabulary {CHARS!r}")
    return self._ids[char]

  def encode(self, text: str) -> list[int]:
    bad = sorted({c for c in text if c not in self._ids})
    if bad:
      raise DataError(f"characters {''.join(bad)!r} in {text[:60]!r} are not in the built-in vocabulary {CHARS!r}; "
                      "set data.tokenizer to a tokenizer.json for free text")
    return [self._ids[c] for c in text]

  def decode(self, ids: Sequence[int]) -> str:
    """Ids past the vocabulary (a model's vocab_size may be padded beyond it) decode to U+FFFD, so a sample that
    emits one can never match an answer."""
    n = len(self._chars)
    return "".join(self._chars[int(i)] if 0 <= int(i) < n else "\ufffd" for i in ids)

  def encode_prompt(self, text: str) -> list[int]:
    return [self.bos_id] + self.encode(apply_template(self.chat_template, text))


_EOS_NAMES = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[SEP]")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]")
_PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>")


class HFTokenizer:
  """A Hugging Face tokenizer.json. Special ids come from the named tokens, or from the first of the usual names
  found in the vocabulary (EOS required: `data.eos_token` names it when the file uses another name; BOS may be
  absent, as in Qwen; PAD falls back to EOS). A file `tokenizers` cannot load is a DataError naming it."""

  def __init__(self, path: str | pathlib.Path, chat_template: str = "", *, pad_token: Optional[str] = None,
               bos_token: Optional[str] = None, eos_token: Optional[str] = None):
    from tokenizers import Tokenizer  # imported here: the built-in tasks never need it

    path = pathlib.Path(path).expanduser()
    if path.is_dir():
      path = path / "tokenizer.json"
    if not path.is_file():
      raise DataError(f"data.tokenizer: no tokenizer.json at {path}")
    try:
      self._tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for bad JSON, unknown models, bad encodings
      reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
      raise DataError(f"data.tokenizer: {path} is not a readable tokenizer.json ({reason})") from None
    self.path = str(path)
    self.chat_template = chat_template
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.eos_id = self._special(eos_token, _EOS_NAMES, "EOS")
    if self.eos_id is None:
      raise DataError(f"{path}: no EOS token among {', '.join(_EOS_NAMES)}; name this tokenizer's end-of-sequence "
                      "token with data.eos_token=<token>")
    self.bos_id = self._special(bos_token, _BOS_NAMES, "BOS")
    pad = self._special(pad_token, _PAD_NAMES, "PAD")
    self.pad_id = self.eos_id if pad is None else pad

  def _special(self, name: Optional[str], candidates: Sequence[str], what: str) -> Optional[int]:
    if name:
      tid = self._tok.token_to_id(name)
      if tid is None:
        key = "; data.eos_token must name a token of this tokenizer" if what == "EOS" else ""
        raise DataError(f"{self.path}: {what} token {name!r} is not in the vocabulary{key}")
      return tid
    for cand in candidates:
      tid = self._tok.token_to_id(cand)
      if tid is not None:
        return tid
    return None

  def token_id(self, token: str) -> int:
    tid = self._tok.token_to_id(token)
    if tid is None:
      raise DataError(f"{self.path}: token {token!r} is not in the vocabulary")
    return tid

  def encode(self, text: str) -> list[int]:
    try:
      return list(self._tok.encode(text, add_special_tokens=False).ids)
    except Exception as exc:  # tokenizers: TypeError for str it cannot pass to Rust (lone surrogates), bare Exception
      raise DataError(f"{self.path} cannot tokenize {text[:40]!r} ({type(exc).__name__}: {exc})") from None

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

  def encode_prompt(self, text: str) -> list[int]:
    bos = [] if self.bos_id is None else [self.bos_id]
    return bos + self.encode(apply_template(self.chat_template, text))


def make_tokenizer(cfg) -> CharTokenizer | HFTokenizer:
  """From a DataConfig: `data.tokenizer` = "char" or a path to tokenizer.json (or its folder); `data.eos_token`
  (empty: the usual names) names a tokenizer.json's end-of-sequence token."""
  if cfg.tokenizer == "char":
    if cfg.eos_token not in ("", EOS_CHAR):
      raise DataError(f"data.eos_token={cfg.eos_token!r} needs data.tokenizer set to a tokenizer.json: the built-in "
                      f"character vocabulary's EOS is {EOS_CHAR!r}")
    return CharTokenizer(cfg.chat_template)
  return HFTokenizer(cfg.tokenizer, cfg.chat_template, eos_token=cfg.eos_token or None)
