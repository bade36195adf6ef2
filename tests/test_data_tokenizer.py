"""Character tokenizer for the built-in tasks and the tokenizer.json wrapper share one interface."""

import dataclasses

import pytest

from tests.fixtures import make_fixtures
from scalerl_jax.config import DataConfig, RunConfig
from scalerl_jax.data.sources import DataError
from scalerl_jax.data.tokenizer import CharTokenizer, HFTokenizer, make_tokenizer


def test_char_vocabulary_fits_the_default_model():
  tok = CharTokenizer()
  assert tok.vocab_size == 25 <= RunConfig().model.vocab_size  # "x" (the code task) appended: earlier ids kept
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


@pytest.mark.parametrize("content", [b"{garbage", b"", b'{"version": "1.0"}', b'{"model": {"type": "WordLevel", "vo',
                                     '{"added_tokens": "caf\xe9"}'.encode("latin-1")])
def test_corrupt_tokenizer_json_is_a_data_error_naming_the_file(tmp_path, content):
  path = tmp_path / "tokenizer.json"
  path.write_bytes(content)
  with pytest.raises(DataError) as err:
    HFTokenizer(tmp_path)
  message = str(err.value)
  assert message.startswith(f"data.tokenizer: {path} is not a readable tokenizer.json (") and "\n" not in message
  with pytest.raises(DataError, match="is not a readable tokenizer.json"):
    make_tokenizer(DataConfig(tokenizer=str(path)))


def _no_usual_eos(tmp_path):
  from tokenizers import Tokenizer, models
  tok = Tokenizer(models.WordLevel({"<unk>": 0, "<stop>": 1, "a": 2}, unk_token="<unk>"))
  path = tmp_path / "tokenizer.json"
  tok.save(str(path))
  return path


def test_missing_eos_says_to_set_data_eos_token(tmp_path):
  path = _no_usual_eos(tmp_path)
  with pytest.raises(DataError, match=r"no EOS token among .*; name this tokenizer's end-of-sequence token with "
                                      r"data\.eos_token=<token>"):
    make_tokenizer(DataConfig(tokenizer=str(path)))


def test_make_tokenizer_passes_data_eos_token(tmp_path):
  path = _no_usual_eos(tmp_path)
  assert make_tokenizer(DataConfig(tokenizer=str(path), eos_token="<stop>")).eos_id == 1
  with pytest.raises(DataError, match=r"EOS token '<end>' is not in the vocabulary; data\.eos_token must name a "
                                      r"token of this tokenizer"):
    make_tokenizer(DataConfig(tokenizer=str(path), eos_token="<end>"))
  fixture = make_fixtures.write_tokenizer_json(tmp_path / "other.json")
  assert make_tokenizer(DataConfig(tokenizer=str(fixture), eos_token="<|assistant|>")).eos_id == 5  # overrides </s>
  with pytest.raises(DataError, match=r"data\.eos_token='</s>' needs data\.tokenizer set to a tokenizer\.json"):
    make_tokenizer(DataConfig(eos_token="</s>"))
  assert make_tokenizer(DataConfig(eos_token="$")).eos_id == CharTokenizer().eos_id  # the built-in EOS itself


def test_text_the_tokenizer_cannot_take_is_a_data_error(tmp_path):
  tok = HFTokenizer(make_fixtures.write_tokenizer_json(tmp_path / "tokenizer.json"))
  with pytest.raises(DataError, match=r"tokenizer\.json cannot tokenize '\\ud800'"):
    tok.encode("\ud800")


def test_every_tokenizer_lists_its_eos_ids_and_only_checkpoints_render_chat(tmp_path):
  assert CharTokenizer().eos_ids == (CharTokenizer().eos_id,)
  tok = HFTokenizer(make_fixtures.write_tokenizer_json(tmp_path / "tokenizer.json"))
  assert tok.eos_ids == (tok.eos_id,) and tok.chat is None
  with pytest.raises(DataError, match=r"tokenizer\.json: this tokenizer has no Jinja chat template"):
    tok.render_chat([{"role": "user", "content": "Ava"}])
  assert make_tokenizer(DataConfig(tokenizer=str(tmp_path)), vocab_size=tok.vocab_size).eos_ids == tok.eos_ids
