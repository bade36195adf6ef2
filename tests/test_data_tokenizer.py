"""Character tokenizer for the built-in tasks and the tokenizer.json wrapper share one interface."""

import dataclasses

import pytest

from tests.fixtures import make_fixtures
from scalerl_jax.config import DataConfig, RunConfig
from scalerl_jax.data.sources import DataError
from scalerl_jax.data.tokenizer import CharTokenizer, HFTokenizer, make_tokenizer


def test_char_vocabulary_fits_the_default_model():
  tok = CharTokenizer()
  assert tok.vocab_size == 24 <= RunConfig().model.vocab_size
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, tok.token_id("$"))
  assert tok.token_id("0") == 2 and tok.token_id("|") == 17


def test_char_roundtrip_and_prompt_encoding():
  tok = CharTokenizer()
  text = "730+584=0110|2250$"
  ids = tok.encode(text)
  assert len(ids) == len(text) and tok.decode(ids) == text
  assert tok.encode_prompt("730+584=") == [tok.bos_id] + tok.encode("730+584=")
  assert tok.decode([tok.bos_id, *tok.encode("1,2>3:"), tok.pad_id]) == "1,2>3:"  # specials decode to ''


def test_char_unknown_character_is_a_clear_error():
  with pytest.raises(DataError, match="'a'.*not in the built-in vocabulary"):
    CharTokenizer().encode("1+a")


def test_hf_tokenizer_specials_template_and_roundtrip(tmp_path):
  path = make_fixtures.write_tokenizer_json(tmp_path / "tokenizer.json")
  tok = HFTokenizer(path, chat_template="<|user|> {prompt} <|assistant|>")
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  words = tok.encode("Ava has 4 apples .")
  assert tok.decode(words) == "Ava has 4 apples ."
  ids = tok.encode_prompt("Ava has 4 apples .")
  assert ids == [1, tok.token_id("<|user|>")] + words + [tok.token_id("<|assistant|>")]
  assert tok.decode(ids + [tok.eos_id]) == "Ava has 4 apples ."  # special tokens are dropped from decoded text


def test_hf_tokenizer_named_specials_and_missing_eos(tmp_path):
  path = make_fixtures.write_tokenizer_json(tmp_path / "tokenizer.json")
  tok = HFTokenizer(tmp_path, eos_token="<|assistant|>", pad_token="<unk>")  # a folder works too
  assert tok.eos_id == tok.token_id("<|assistant|>") and tok.pad_id == 3
  with pytest.raises(DataError, match="EOS token '<nope>' is not in the vocabulary"):
    HFTokenizer(path, eos_token="<nope>")
  with pytest.raises(DataError, match="no tokenizer.json"):
    HFTokenizer(tmp_path / "missing")


def test_make_tokenizer_from_config(tmp_path):
  assert isinstance(make_tokenizer(DataConfig()), CharTokenizer)
  path = make_fixtures.write_tokenizer_json(tmp_path / "tokenizer.json")
  tok = make_tokenizer(dataclasses.replace(DataConfig(), tokenizer=str(path), chat_template="{prompt} <|assistant|>"))
  assert isinstance(tok, HFTokenizer) and tok.encode_prompt("Ava")[-1] == tok.token_id("<|assistant|>")
