"""A GGUF file's vocabulary as a Hugging Face `tokenizers.Tokenizer` (what tokenizer.json holds), with its special
ids and chat template: the tokenizer of a GGUF checkpoint (data/tokenizer.py GGUFTokenizer) and the tokenizer
files the converter writes (model/gguf_convert.py).

Supported: `tokenizer.ggml.model` "gpt2" (byte-level BPE: `tokenizer.ggml.tokens` in byte-level spelling, `merges`
as "left right" strings in rank order) with one of the pre-tokenizers below, named by `tokenizer.ggml.pre`; any
other model or pre-tokenizer is a DataError naming the file and the value. `tokenizer.ggml.token_type` marks the
added tokens: CONTROL (3) ones become special added tokens (matched in text, skipped when decoding), USER_DEFINED
(4) ones plain added tokens (matched in text, decoded). BOS is prepended by the post-processor when
`tokenizer.ggml.add_bos_token` says so (absent: llama.cpp's default for the pre-tokenizer, true for llama-bpe only).

  tokenizer.ggml.pre            Hugging Face pre-tokenizer (llama.cpp's regexes for the same name)
  smollm, starcoder             Digits(individual_digits) then ByteLevel (GPT-2's regex): SmolLM / SmolLM2, StarCoder
  gpt-2                         ByteLevel (GPT-2's regex)
  llama-bpe, llama3, llama-v3   Split(Llama 3's regex, isolated) then ByteLevel without its regex; BPE with
                                ignore_merges (a whole word in the vocabulary is one token), as Llama 3's tokenizer.json
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Optional

from scalerl_jax.data.sources import DataError

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)")
PRE_TOKENIZERS = ("smollm", "starcoder", "gpt-2", "llama-bpe", "llama3", "llama-v3")
_LLAMA3 = ("llama-bpe", "llama3", "llama-v3")
CONTROL, USER_DEFINED = 3, 4  # gguf.TokenType


def _pre_tokenizer(pre: str):
  from tokenizers import Regex, pre_tokenizers as pt
  byte_level = pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=pre not in _LLAMA3)
  if pre in ("smollm", "starcoder"):
    return pt.Sequence([pt.Digits(individual_digits=True), byte_level])
  if pre in _LLAMA3:
    return pt.Sequence([pt.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False), byte_level])
  return byte_level


@dataclasses.dataclass(frozen=True)
class GGUFVocab:
  """`tokenizer` (tokenizers.Tokenizer), the special ids (`bos_id` None when the file names none; `eos_ids`: every
  id that ends a sequence; `pad_id`), `add_bos`, the chat template source (None without one) and `tokens`."""
  path: pathlib.Path
  tokenizer: Any
  tokens: tuple[str, ...]
  bos_id: Optional[int]
  eos_ids: tuple[int, ...]
  pad_id: Optional[int]
  add_bos: bool
  chat_template: Optional[str]
  context_length: Optional[int]

  def token(self, i: Optional[int]) -> Optional[str]:
    return None if i is None else self.tokens[i]

  @property
  def special_tokens(self) -> dict[str, Optional[str]]:
    """The chat template's special token strings (bos_token, eos_token, pad_token), as tokenizer_config.json's."""
    return {"bos_token": self.token(self.bos_id), "eos_token": self.token(self.eos_ids[0] if self.eos_ids else None),
            "pad_token": self.token(self.pad_id)}

  def tokenizer_config(self) -> dict[str, Any]:
    """tokenizer_config.json for a Hugging Face checkpoint directory (transformers' PreTrainedTokenizerFast)."""
    out: dict[str, Any] = {"add_bos_token": self.add_bos, "add_eos_token": False, "clean_up_tokenization_spaces": False,
                           "tokenizer_class": "PreTrainedTokenizerFast"}
    out.update({k: v for k, v in self.special_tokens.items() if v is not None})
    if self.chat_template is not None:
      out["chat_template"] = self.chat_template
    if self.context_length:
      out["model_max_length"] = self.context_length
    return out


def read_vocab(path: str | pathlib.Path, meta: Optional[dict] = None) -> GGUFVocab:
  """The vocabulary of GGUF file `path` (`meta`: its metadata when already read, model.gguf.read_metadata)."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, processors

  from scalerl_jax.model import gguf
  path = pathlib.Path(path)
  if meta is None:
    meta = gguf.read_metadata(path)[1]
  model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
  if model != "gpt2":
    raise DataError(f"{path}: tokenizer.ggml.model={model!r} is not supported (only 'gpt2', byte-level BPE)")
  if pre not in PRE_TOKENIZERS:
    raise DataError(f"{path}: tokenizer.ggml.pre={pre!r} is not a supported pre-tokenizer (supported: "
                    f"{', '.join(PRE_TOKENIZERS)})")
  tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
  types = meta.get("tokenizer.ggml.token_type") or []
  if not isinstance(tokens, list) or not tokens:
    raise DataError(f"{path}: lacks the metadata key 'tokenizer.ggml.tokens'")
  if not isinstance(merges, list):
    raise DataError(f"{path}: lacks the metadata key 'tokenizer.ggml.merges' (a gpt2 tokenizer needs its merges)")
  if types and len(types) != len(tokens):
    raise DataError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
  vocab = {}
  for i, t in enumerate(tokens):
    vocab.setdefault(t, i)  # a duplicate spelling (unused slots) keeps its first id, as llama.cpp's token_to_id
  pairs = []
  for m in merges:
    left, sep, right = m.partition(" ")
    if not sep or left not in vocab or right not in vocab:
      raise DataError(f"{path}: tokenizer.ggml.merges entry {m!r} is not two tokens of the vocabulary")
    pairs.append((left, right))
  try:
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in _LLAMA3))
  except Exception as e:  # tokenizers' own message
    raise DataError(f"{path}: the vocabulary does not build a BPE tokenizer ({e})") from None
  tok.pre_tokenizer = _pre_tokenizer(pre)
  tok.decoder = decoders.ByteLevel()
  added = [AddedToken(tokens[i], special=types[i] == CONTROL, normalized=False)
           for i in range(len(types)) if types[i] in (CONTROL, USER_DEFINED) and vocab[tokens[i]] == i]
  tok.add_tokens(added)  # an AddedToken's `special` decides skip-on-decode (add_tokens keeps it)
  ids = gguf.special_ids(meta, path, len(tokens))
  add_bos = meta.get("tokenizer.ggml.add_bos_token", pre in _LLAMA3)
  if add_bos and ids.bos_id is None:
    raise DataError(f"{path}: tokenizer.ggml.add_bos_token is true but the file names no bos_token_id")
  byte_level = processors.ByteLevel(trim_offsets=False)
  if add_bos:
    bos = tokens[ids.bos_id]
    tok.post_processor = processors.Sequence([byte_level, processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids.bos_id)])])
  else:
    tok.post_processor = byte_level
  template = meta.get("tokenizer.chat_template")
  context = meta.get(f"{meta.get('general.architecture')}.context_length")
  return GGUFVocab(path, tok, tuple(tokens), ids.bos_id, ids.eos_ids, ids.pad_id, bool(add_bos),
                   template if isinstance(template, str) else None, context if isinstance(context, int) else None)


def tokenizer_json(vocab: GGUFVocab) -> str:
  """tokenizer.json's text for the vocabulary (indented, non-ASCII kept)."""
  return json.dumps(json.loads(vocab.tokenizer.to_str()), indent=2, ensure_ascii=False) + "\n"
