"""A Hugging Face checkpoint's tokenizer (scalerl_jax/data/tokenizer.py: tokenizer_from_pretrained) and Jinja chat
template (scalerl_jax/data/chat.py) against the committed transformers fixtures (tests/fixtures/hf, tools/README.md):
the rendering and its ids equal transformers' apply_chat_template, special ids come from the checkpoint's configs,
and every bad input is an error naming its file. No torch, no transformers."""

import dataclasses
import json
import pathlib
import shutil

import pytest

from scalerl_jax.config import DataConfig
from scalerl_jax.data.chat import ChatTemplate
from scalerl_jax.data.sources import DataError
from scalerl_jax.data.tokenizer import PretrainedTokenizer, make_tokenizer, tokenizer_from_pretrained
from scalerl_jax.errors import UserError

ROOT = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILIES = ("llama", "qwen2", "qwen3")


def _ref(name):
  return json.loads((ROOT / name / "reference.json").read_text())


def _copy(name, tmp_path) -> pathlib.Path:
  """The fixture's tokenizer and config files (no weights) in a directory of our own to break."""
  d = tmp_path / name
  d.mkdir()
  for f in (ROOT / name).iterdir():
    if f.suffix in (".json", ".jinja") and f.name != "reference.json":
      shutil.copy(f, d / f.name)
  return d


def _edit(path: pathlib.Path, **changes):
  data = json.loads(path.read_text())
  for k, v in changes.items():
    if v is None:
      data.pop(k, None)
    else:
      data[k] = v
  path.write_text(json.dumps(data))


@pytest.mark.parametrize("name", FAMILIES)
def test_rendering_and_ids_equal_transformers(name):
  tok, chat = tokenizer_from_pretrained(ROOT / name), _ref(name)["chat"]
  rendered = tok.render_chat(chat["messages"], add_generation_prompt=True)
  assert rendered == chat["rendered"]
  assert tok.render_chat(chat["messages"], add_generation_prompt=False) == chat["rendered_without_generation_prompt"]
  assert tok.encode(rendered) == chat["rendered_ids"]  # add_special_tokens=False: the template wrote BOS itself


@pytest.mark.parametrize("name", FAMILIES)
def test_special_ids_come_from_the_checkpoint(name):
  tok, ref = tokenizer_from_pretrained(ROOT / name), _ref(name)
  special = ref["special_tokens"]
  assert tok.bos_id == special["bos_token_id"] and tok.pad_id == special["pad_token_id"]
  assert list(tok.eos_ids) == special["eos_token_ids"] and tok.eos_id == tok.eos_ids[0]
  assert tok.vocab_size == ref["tokenizer_size"]


@pytest.mark.parametrize("name", FAMILIES)
def test_generate_prompts_encode_as_transformers(name):
  tok = tokenizer_from_pretrained(ROOT / name)
  for p in _ref(name)["generate"]["prompts"]:
    ids = tok.encode(p["prompt"]) if p.get("from_chat") else tok.encode(p["prompt"], add_special_tokens=True)
    assert ids == p["prompt_ids"]


@pytest.mark.parametrize("name", FAMILIES)
def test_make_tokenizer_on_a_checkpoint_renders_prompts_as_one_user_turn(name):
  tok = make_tokenizer(DataConfig(tokenizer=str(ROOT / name)))
  assert isinstance(tok, PretrainedTokenizer)
  text = "two plus three?"
  rendered = tok.render_chat([{"role": "user", "content": text}], add_generation_prompt=True)
  assert tok.render_prompt(text) == rendered and tok.encode_prompt(text) == tok.encode(rendered)
  assert (tok.encode_prompt(text)[0] == tok.bos_id) == (name == "llama")  # only Llama's template writes BOS
  # data.chat_template (a `{prompt}` format string) overrides the checkpoint's; the post-processor adds BOS
  fmt = make_tokenizer(DataConfig(tokenizer=str(ROOT / name), chat_template="Q: {prompt} A:"))
  assert fmt.encode_prompt(text) == tok.encode("Q: two plus three? A:", add_special_tokens=True)


def test_data_eos_token_comes_first(tmp_path):
  tok = make_tokenizer(DataConfig(tokenizer=str(ROOT / "llama"), eos_token="<|end_of_text|>"))
  assert tok.eos_id == tok.token_id("<|end_of_text|>") and set(tok.eos_ids) == {113, 116}
  with pytest.raises(DataError, match="EOS token '<nope>' is not in the vocabulary"):
    make_tokenizer(DataConfig(tokenizer=str(ROOT / "llama"), eos_token="<nope>"))


def test_ids_fall_back_to_tokenizer_config_names(tmp_path):
  d = _copy("llama", tmp_path)
  (d / "generation_config.json").unlink()
  for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
    _edit(d / "config.json", **{key: None})
  tok = tokenizer_from_pretrained(d)
  assert (tok.bos_id, tok.eos_ids, tok.pad_id) == (112, (116,), 117)  # <|begin_of_text|>, <|eot_id|>, pad
  _edit(d / "tokenizer_config.json", pad_token=None)
  assert tokenizer_from_pretrained(d).pad_id == 116  # PAD falls back to EOS


def test_chat_template_jinja_wins_and_named_templates(tmp_path):
  d = _copy("qwen2", tmp_path)
  (d / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
  assert tokenizer_from_pretrained(d).render_prompt("hi") == "[hi]"
  (d / "chat_template.jinja").unlink()
  _edit(d / "tokenizer_config.json", chat_template=[{"name": "tool_use", "template": "T"},
                                                   {"name": "default", "template": "D{{ messages|length }}"}])
  assert tokenizer_from_pretrained(d).render_prompt("hi") == "D1"
  _edit(d / "tokenizer_config.json", chat_template=[{"name": "tool_use", "template": "T"}])
  with pytest.raises(DataError, match=r"tokenizer_config\.json: chat_template is a list without a 'default'"):
    tokenizer_from_pretrained(d)
  _edit(d / "tokenizer_config.json", chat_template=None)
  tok = tokenizer_from_pretrained(d)  # no template at all: prompts are the plain text
  assert tok.chat is None and tok.encode_prompt("hi") == tok.encode("hi", add_special_tokens=True)
  with pytest.raises(DataError, match="has no Jinja chat template"):
    tok.render_chat([{"role": "user", "content": "hi"}])


def test_transformers_helpers_are_available():
  source = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m | tojson }}{% endfor %}"
            "{{ strftime_now('%Y') | length }}{{ bos_token }}|{{ pad_token }}|")
  chat = ChatTemplate(source, "t.jinja", {"bos_token": "<s>", "eos_token": "</s>"})
  out = chat.render([{"role": "user", "content": "café"}, {"role": "user", "content": "x"}])
  assert out == '{"role": "user", "content": "café"}4<s>||'  # ensure_ascii=False, loopcontrols, undefined -> ''


@pytest.mark.parametrize("source, reason", [
    ("{% for m in messages %}", r"TemplateSyntaxError at line 1: Unexpected end of template"),
    ("{{ raise_exception('only user turns, got ' + messages[0]['role']) }}", r"TemplateError: only user turns, got user"),
    ("{{ messages.append(1) }}", r"SecurityError"),  # the immutable sandbox
    ("{{ messages[0]['content'].nope.deeper }}", r"UndefinedError"),
])
def test_a_template_that_fails_names_the_file_and_the_jinja_error(tmp_path, source, reason):
  d = _copy("qwen3", tmp_path)
  (d / "chat_template.jinja").write_text(source)
  with pytest.raises(DataError, match=rf"^{d / 'chat_template.jinja'}: the chat template .*{reason}"):
    tokenizer_from_pretrained(d).encode_prompt("hi")


def test_unreadable_tokenizer_config_names_the_file(tmp_path):
  d = _copy("llama", tmp_path)
  (d / "tokenizer_config.json").write_text("{not json")
  with pytest.raises(UserError, match=rf"{d / 'tokenizer_config.json'}: not readable JSON"):
    make_tokenizer(DataConfig(tokenizer=str(d)))
  (d / "tokenizer_config.json").write_text("[1, 2]")
  with pytest.raises(DataError, match=rf"{d / 'tokenizer_config.json'}: not a JSON object"):
    tokenizer_from_pretrained(d)
  (d / "chat_template.jinja").write_bytes(b"\xff\xfe{{")
  (d / "tokenizer_config.json").write_text("{}")
  with pytest.raises(DataError, match=rf"{d / 'chat_template.jinja'}: not a readable chat template"):
    tokenizer_from_pretrained(d)


def test_missing_special_tokens_name_the_files(tmp_path):
  d = _copy("qwen3", tmp_path)
  _edit(d / "generation_config.json", eos_token_id=[90, 500])
  with pytest.raises(DataError, match=rf"{d / 'generation_config.json'}: eos_token_id 500 is not an id of "
                                      rf".*tokenizer\.json \(91 tokens\)"):
    tokenizer_from_pretrained(d)
  _edit(d / "generation_config.json", eos_token_id="im_end")
  with pytest.raises(DataError, match=r"generation_config\.json: eos_token_id='im_end' is not an id"):
    tokenizer_from_pretrained(d)
  _edit(d / "generation_config.json", eos_token_id=None)
  _edit(d / "config.json", eos_token_id=None)
  _edit(d / "tokenizer_config.json", eos_token="<|nope|>")
  with pytest.raises(DataError, match=rf"{d / 'tokenizer_config.json'}: eos_token '<\|nope\|>' is not in the "
                                      r"vocabulary of .*tokenizer\.json"):
    tokenizer_from_pretrained(d)
  _edit(d / "tokenizer_config.json", eos_token=None)
  with pytest.raises(DataError, match=r"no EOS id: neither generation_config\.json nor config\.json sets "
                                      r"eos_token_id .*data\.eos_token=<token>"):
    tokenizer_from_pretrained(d)
  assert tokenizer_from_pretrained(d, eos_token="<|im_end|>").eos_ids == (90,)
  (d / "tokenizer.json").unlink()
  with pytest.raises(DataError, match="no tokenizer.json at"):
    tokenizer_from_pretrained(d)


def test_vocabulary_larger_than_the_embedding_names_the_file(tmp_path):
  d = _copy("qwen3", tmp_path)
  _edit(d / "config.json", vocab_size=64)  # the tokenizer has 91 tokens
  with pytest.raises(DataError, match=rf"^{d / 'tokenizer.json'}: the tokenizer has 91 tokens, more than the "
                                      rf"embedding's 64 rows \(model\.vocab_size=64, from {d / 'config.json'}"):
    make_tokenizer(DataConfig(tokenizer=str(d)))
  with pytest.raises(DataError, match=r"tokenizer\.json: the tokenizer has 91 tokens.*model\.vocab_size=90, from "
                                      r"model\.vocab_size"):
    make_tokenizer(DataConfig(tokenizer=str(ROOT / "qwen3")), vocab_size=90)
  bare = tmp_path / "bare"
  bare.mkdir()
  shutil.copy(ROOT / "qwen3" / "tokenizer.json", bare / "tokenizer.json")  # a folder holding only tokenizer.json
  cfg = dataclasses.replace(DataConfig(), tokenizer=str(bare), eos_token="<|im_end|>")
  assert not isinstance(make_tokenizer(cfg), PretrainedTokenizer)
  with pytest.raises(DataError, match=rf"^{bare / 'tokenizer.json'}: the tokenizer has 91 tokens"):
    make_tokenizer(cfg, vocab_size=32)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_checkpoints_tokenizer_json_reads_as_its_directory(name):
  """data.tokenizer naming a checkpoint's tokenizer.json rather than its directory: the same tokenizer, chat template
  and special ids (it was read bare: no chat template, so the prompt went in without its chat turn)."""
  by_file = make_tokenizer(DataConfig(tokenizer=str(ROOT / name / "tokenizer.json")))
  by_dir = make_tokenizer(DataConfig(tokenizer=str(ROOT / name)))
  assert isinstance(by_file, PretrainedTokenizer) and by_file.chat is not None
  assert by_file.render_prompt("What is 2+3?") == by_dir.render_prompt("What is 2+3?") != "What is 2+3?"
  assert by_file.encode_prompt("What is 2+3?") == by_dir.encode_prompt("What is 2+3?")
  assert (by_file.bos_id, by_file.eos_ids, by_file.pad_id) == (by_dir.bos_id, by_dir.eos_ids, by_dir.pad_id)


def _check_pair(weights: pathlib.Path, tokenizer: str | pathlib.Path) -> None:
  """validate_with_tokenizer as RLJob runs it: the architecture from `weights`' config.json, data.tokenizer's
  tokenizer (interruption off: only the model/tokenizer checks speak)."""
  from scalerl_jax.config import RunConfig, validate_with_tokenizer
  from scalerl_jax.model.hf import hf_model_config

  cfg = RunConfig()
  cfg = dataclasses.replace(
      cfg, model=dataclasses.replace(hf_model_config(weights), pretrained=str(weights)),
      data=dataclasses.replace(cfg.data, tokenizer=str(tokenizer)),
      rollout=dataclasses.replace(cfg.rollout, interruption=dataclasses.replace(cfg.rollout.interruption,
                                                                                enabled=False)))
  validate_with_tokenizer(cfg, make_tokenizer(cfg.data, vocab_size=cfg.model.vocab_size))


def test_a_tokenizer_of_another_model_is_refused_naming_the_keys(tmp_path):
  from scalerl_jax.config import ConfigError

  bare = tmp_path / "bare"  # a folder holding only a tokenizer.json: its special ids by the usual names
  bare.mkdir()
  shutil.copy(ROOT / "qwen3" / "tokenizer.json", bare / "tokenizer.json")
  weights_only = tmp_path / "weights_only"  # as a character-tokenizer run exports: no tokenizer, no special ids
  weights_only.mkdir()
  shutil.copy(ROOT / "qwen3" / "model.safetensors", weights_only / "model.safetensors")
  shutil.copy(ROOT / "qwen3" / "config.json", weights_only / "config.json")
  _edit(weights_only / "config.json", bos_token_id=None, eos_token_id=None, pad_token_id=None)
  for weights, tokenizer in [(ROOT / n, ROOT / n) for n in FAMILIES] + [
      (ROOT / "llama", ROOT / "llama" / "tokenizer.json"), (ROOT / "qwen3", bare), (weights_only, "char")]:
    _check_pair(weights, tokenizer)  # the real matches (Qwen pads vocab_size past its tokenizer's 91 tokens)
  (tmp_path / "b").mkdir()
  (tmp_path / "e").mkdir()
  other_bos = _copy("llama", tmp_path / "b")  # Llama's tokenizer files, with another model's special ids
  for f in ("config.json", "generation_config.json"):
    _edit(other_bos / f, bos_token_id=1)
  other_eos = _copy("llama", tmp_path / "e")
  for f in ("config.json", "generation_config.json"):
    _edit(other_eos / f, eos_token_id=[5])
  _edit(other_eos / "tokenizer_config.json", eos_token=None)
  cases = [(ROOT / "qwen3", "char", r"data\.tokenizer: char \(the built-in character vocabulary\) with "
                                    rf"model\.pretrained={ROOT / 'qwen3'}, a checkpoint with its own tokenizer "
                                    r"\(tokenizer\.json\).*data\.tokenizer="),
           (ROOT / "qwen2", ROOT / "qwen3", rf"data\.tokenizer: model\.pretrained={ROOT / 'qwen2'} names bos_token_id "
                                            rf"96, not an id of data\.tokenizer={ROOT / 'qwen3'} \(91 tokens\)"),
           (ROOT / "llama", ROOT / "qwen2", r"names bos_token_id 112, not an id of .*\(99 tokens\)"),
           (ROOT / "qwen2", bare, r"names bos_token_id 96, not an id of .*bare \(91 tokens\)"),
           (ROOT / "llama", other_bos, r"data\.tokenizer: .* has BOS id 1 but model\.pretrained=.*llama names "
                                       r"bos_token_id 112"),
           (ROOT / "llama", other_eos, r"stops on EOS ids \[5\] but model\.pretrained=.* names eos_token_id "
                                       r"\[113, 116\]")]
  for weights, tokenizer, msg in cases:
    with pytest.raises(ConfigError, match=msg):
      _check_pair(weights, tokenizer)


def test_the_tokenizer_reads_checkpoint_json_through_the_loaders_public_rule(tmp_path):
  """data/tokenizer.py uses model/hf.py's public read_json (the loader's, exporter's and tokenizer's one rule for a
  checkpoint's JSON files), not an underscore helper of another module: read from its source."""
  import ast
  from scalerl_jax.model.hf import read_json

  source = pathlib.Path(__file__).resolve().parents[1] / "scalerl_jax" / "data" / "tokenizer.py"
  private = [f"{node.module}.{a.name}" for node in ast.walk(ast.parse(source.read_text()))
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scalerl_jax.")
             for a in node.names if a.name.startswith("_")]
  assert not private, private
  assert read_json(tmp_path / "absent.json", optional=True) == {}
  with pytest.raises(UserError, match=r"absent\.json: no such file"):
    read_json(tmp_path / "absent.json")
