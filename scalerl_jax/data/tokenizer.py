"""Tokenizers: a character-level one for the built-in tasks, a wrapper over HF `tokenizers` (tokenizer.json), a
Hugging Face checkpoint's tokenizer (`tokenizer_from_pretrained(dir)`: tokenizer.json, its special ids from the
checkpoint's configs and its Jinja chat template, scalerl_jax/data/chat.py) and a GGUF file's (GGUFTokenizer: the
same, built from the file's vocabulary, merges and metadata by data/gguf_vocab.py).

All expose one interface: `pad_id`, `bos_id` (None when the model has no BOS), `eos_id` (the first of `eos_ids`,
every id that ends a sequence: the rollout engine's stop_ids), `vocab_size`, `encode(str) -> list[int]`,
`decode(ids) -> str`, `token_id(token) -> int` and `encode_prompt(str) -> list[int]`, the prompt's ids. With
`data.chat_template` (a plain format string in which `{prompt}` is replaced by the prompt text, e.g.
"<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n"; no jinja) encode_prompt prepends BOS to the
formatted text; a checkpoint's Jinja template, when data.chat_template is empty, renders the prompt as one user turn
with the generation prompt and encodes it without special tokens (the template writes BOS where the model wants it).

Character vocabulary (24 ids, shared by every built-in task; the model's vocab_size of 32 leaves room):

    0 PAD   1 BOS   2..11 '0'..'9'   12 '+'  13 '-'  14 '*'  15 '/'  16 '='  17 '|'  18 '$'  19 ','  20 '>'
    21 ':'  22 '('  23 ')'

'$' is EOS and '|' the end-of-thinking marker (rollout.interruption.end_marker / phrase; both in
scalerl_jax/markers.py, which the verifiers read too). PAD and BOS decode to ''.
"""

from __future__ import annotations

import pathlib
from typing import Any, Mapping, Optional, Sequence

from scalerl_jax.data.chat import ChatTemplate, load_chat_template
from scalerl_jax.data.sources import DataError
from scalerl_jax.markers import EOS_CHAR

CHARS = "0123456789+-*/=|$,>:()x"  # x: the built-in code task's variable (appended: earlier ids unchanged)


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
    self.eos_ids = (self.eos_id,)
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

  chat: Optional[ChatTemplate] = None  # a checkpoint's Jinja chat template (PretrainedTokenizer)
  prompt_specials = False  # encode_prompt lets tokenizer.json's post-processor add BOS (PretrainedTokenizer)

  def __init__(self, path: str | pathlib.Path, chat_template: str = "", *, pad_token: Optional[str] = None,
               bos_token: Optional[str] = None, eos_token: Optional[str] = None):
    path = self._load(path)
    self.chat_template = chat_template
    self.eos_id = self._special(eos_token, _EOS_NAMES, "EOS")
    if self.eos_id is None:
      raise DataError(f"{path}: no EOS token among {', '.join(_EOS_NAMES)}; name this tokenizer's end-of-sequence "
                      "token with data.eos_token=<token>")
    self.eos_ids = (self.eos_id,)
    self.bos_id = self._special(bos_token, _BOS_NAMES, "BOS")
    pad = self._special(pad_token, _PAD_NAMES, "PAD")
    self.pad_id = self.eos_id if pad is None else pad

  def _load(self, path: str | pathlib.Path) -> pathlib.Path:
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
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    return path

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

  def added_tokens(self) -> frozenset[str]:
    """tokenizer.json's added tokens: its specials and markers a model writes whole (Qwen3's <think>, </think>)."""
    return frozenset(t.content for t in self._tok.get_added_tokens_decoder().values())

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    """Ids of `text`; `add_special_tokens` runs tokenizer.json's post-processor (e.g. Llama's BOS)."""
    try:
      return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)
    except Exception as exc:  # tokenizers: TypeError for str it cannot pass to Rust (lone surrogates), bare Exception
      raise DataError(f"{self.path} cannot tokenize {text[:40]!r} ({type(exc).__name__}: {exc})") from None

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

  def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The conversation rendered by the checkpoint's Jinja chat template, as transformers' apply_chat_template."""
    if self.chat is None:
      raise DataError(f"{self.path}: this tokenizer has no Jinja chat template (a checkpoint directory's "
                      "tokenizer_config.json chat_template or chat_template.jinja)")
    return self.chat.render(messages, add_generation_prompt)

  def render_prompt(self, text: str) -> str:
    """The text encode_prompt encodes: data.chat_template's format, else the Jinja template's user turn."""
    if self.chat is not None and not self.chat_template:
      return self.chat.render_prompt(text)
    return apply_template(self.chat_template, text)

  def encode_prompt(self, text: str) -> list[int]:
    if self.chat is not None and not self.chat_template:
      return self.encode(self.chat.render_prompt(text))  # the template writes BOS itself
    if self.prompt_specials:
      return self.encode(apply_template(self.chat_template, text), add_special_tokens=True)
    bos = [] if self.bos_id is None else [self.bos_id]
    return bos + self.encode(apply_template(self.chat_template, text))


class PretrainedTokenizer(HFTokenizer):
  """A Hugging Face checkpoint directory's tokenizer.json with the checkpoint's special ids, read by the rule
  load_pretrained reads them with (`model.hf.special_ids`): each of BOS / EOS / PAD from generation_config.json,
  else config.json (`*_token_id`, an int or a list: every EOS id is kept in `eos_ids`), else tokenizer_config.json's
  token strings, whose `eos_token` is also added to `eos_ids`. PAD falls back to EOS; `eos_token` (data.eos_token)
  puts that token first. The Jinja chat template (`chat`) comes from chat_template.jinja or tokenizer_config.json.
  The tokenizer must fit the embedding: `vocab_size`, else config.json's vocab_size. Errors name the file."""

  prompt_specials = True

  def __init__(self, directory: str | pathlib.Path, chat_template: str = "", *, eos_token: Optional[str] = None,
               vocab_size: Optional[int] = None):
    from scalerl_jax.model.hf import ID_CONFIGS, HFCheckpointError, read_json, special_ids

    d = pathlib.Path(directory).expanduser()
    if not d.is_dir():
      raise DataError(f"data.tokenizer: {d} is not a checkpoint directory")
    self._load(d / "tokenizer.json")
    self.directory, self.chat_template = d, chat_template
    tok_file = d / "tokenizer_config.json"
    tok_cfg = read_json(tok_file, optional=True)
    if not isinstance(tok_cfg, dict):
      raise DataError(f"{tok_file}: not a JSON object")
    self.tokenizer_config = tok_cfg
    self.chat = load_chat_template(d, tok_cfg)
    try:
      ids = special_ids(d, self._tok.token_to_id, vocab=(self.vocab_size, self.path))
    except HFCheckpointError as e:  # a data.tokenizer problem: the same message, as the data error it is here
      raise DataError(str(e)) from None
    eos = ids.eos_ids
    if eos_token:
      eos = (self._special(eos_token, (), "EOS"),) + eos
    if not eos:
      raise DataError(f"{d}: no EOS id: neither {' nor '.join(ID_CONFIGS)} sets eos_token_id and "
                      f"{tok_file.name} names no eos_token; name the end-of-sequence token with data.eos_token=<token>")
    self.eos_ids = tuple(dict.fromkeys(eos))
    self.eos_id = self.eos_ids[0]
    self.bos_id = ids.bos_id
    self.pad_id = self.eos_id if ids.pad_id is None else ids.pad_id
    model_cfg = read_json(d / "config.json", optional=True)
    if vocab_size is None and isinstance(model_cfg.get("vocab_size"), int):
      check_vocab(self, model_cfg["vocab_size"], f"{d / 'config.json'} vocab_size")
    elif vocab_size is not None:
      check_vocab(self, vocab_size)


class GGUFTokenizer(HFTokenizer):
  """A GGUF checkpoint's tokenizer, built from its vocabulary and merges (data/gguf_vocab.py), with the special ids
  load_pretrained reads from the same file (tokenizer.ggml.bos / eos (+ eot, eom) / padding_token_id; PAD falls
  back to EOS; `eos_token` puts that token first) and its Jinja chat template (`tokenizer.chat_template`).
  `directory` is the file (the checkpoint the tokenizer belongs to). Errors name the file and the key."""

  prompt_specials = True

  def __init__(self, path: str | pathlib.Path, chat_template: str = "", *, eos_token: Optional[str] = None,
               vocab_size: Optional[int] = None):
    from scalerl_jax.data.gguf_vocab import read_vocab

    vocab = read_vocab(path)
    self._tok, self.path, self.directory = vocab.tokenizer, str(vocab.path), vocab.path
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.chat_template = chat_template
    self.chat = None if vocab.chat_template is None else ChatTemplate(
        vocab.chat_template, f"{vocab.path} (tokenizer.chat_template)", vocab.special_tokens)
    eos = vocab.eos_ids
    if eos_token:
      eos = (self._special(eos_token, (), "EOS"),) + eos
    if not eos:
      raise DataError(f"{vocab.path}: no EOS id: the file sets no tokenizer.ggml.eos_token_id; name the "
                      "end-of-sequence token with data.eos_token=<token>")
    self.eos_ids = tuple(dict.fromkeys(eos))
    self.eos_id, self.bos_id = self.eos_ids[0], vocab.bos_id
    self.pad_id = self.eos_id if vocab.pad_id is None else vocab.pad_id
    if vocab_size is not None:
      check_vocab(self, vocab_size)


def tokenizer_from_pretrained(directory: str | pathlib.Path, chat_template: str = "", *,
                              eos_token: Optional[str] = None,
                              vocab_size: Optional[int] = None) -> PretrainedTokenizer | GGUFTokenizer:
  """A Hugging Face checkpoint directory's tokenizer (tokenizer.json + configs + chat template), or a GGUF file's
  (a `*.gguf`, or a directory holding one and no config.json), as load_pretrained reads the same path."""
  from scalerl_jax.model.gguf import gguf_path
  g = gguf_path(directory)
  if g is not None:
    return GGUFTokenizer(g, chat_template, eos_token=eos_token, vocab_size=vocab_size)
  return PretrainedTokenizer(directory, chat_template, eos_token=eos_token, vocab_size=vocab_size)


def check_vocab(tokenizer, vocab_size: int, where: str = "model.vocab_size") -> None:
  """A tokenizer whose ids reach past the embedding's `vocab_size` rows is a DataError naming its file."""
  if tokenizer.vocab_size > vocab_size:
    raise DataError(f"{getattr(tokenizer, 'path', 'data.tokenizer')}: the tokenizer has {tokenizer.vocab_size} "
                    f"tokens, more than the embedding's {vocab_size} rows (model.vocab_size={vocab_size}, from "
                    f"{where}); use the checkpoint's own tokenizer or a model with a larger vocab_size")


_CHECKPOINT_FILES = ("tokenizer_config.json", "config.json", "generation_config.json")


def is_checkpoint_dir(path: str | pathlib.Path) -> bool:
  """A directory holding a checkpoint's configs beside tokenizer.json (not a bare tokenizer.json's folder)."""
  p = pathlib.Path(path).expanduser()
  return p.is_dir() and any((p / n).is_file() for n in _CHECKPOINT_FILES)


def make_tokenizer(cfg, vocab_size: Optional[int] = None) -> CharTokenizer | HFTokenizer:
  """From a DataConfig: `data.tokenizer` = "char", a path to tokenizer.json (or a folder holding only it), a
  Hugging Face checkpoint directory (tokenizer_from_pretrained; a checkpoint directory's tokenizer.json is read as
  the directory, with its chat template and special ids), or a GGUF file (GGUFTokenizer); `data.eos_token` (empty: the usual names, or the
  checkpoint's ids) names the end-of-sequence token. `vocab_size` (model.vocab_size) is checked against the
  tokenizer's size with an error naming its file."""
  if cfg.tokenizer == "char":
    if cfg.eos_token not in ("", EOS_CHAR):
      raise DataError(f"data.eos_token={cfg.eos_token!r} needs data.tokenizer set to a tokenizer.json: the built-in "
                      f"character vocabulary's EOS is {EOS_CHAR!r}")
    return CharTokenizer(cfg.chat_template)
  path = pathlib.Path(cfg.tokenizer).expanduser()
  if path.name == "tokenizer.json" and path.is_file() and is_checkpoint_dir(path.parent):
    path = path.parent  # a checkpoint's tokenizer.json: read as its directory (chat template, special ids)
  if is_checkpoint_dir(path):
    return PretrainedTokenizer(path, cfg.chat_template, eos_token=cfg.eos_token or None, vocab_size=vocab_size)
  if not (path / "tokenizer.json").is_file():
    from scalerl_jax.model.gguf import gguf_path
    if gguf_path(path) is not None:
      return GGUFTokenizer(gguf_path(path), cfg.chat_template, eos_token=cfg.eos_token or None, vocab_size=vocab_size)
  tok = HFTokenizer(cfg.tokenizer, cfg.chat_template, eos_token=cfg.eos_token or None)
  if vocab_size is not None:
    check_vocab(tok, vocab_size)
  return tok
