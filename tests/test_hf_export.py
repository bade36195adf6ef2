"""Hugging Face checkpoints out (scalerl_jax/model/hf_export.py, launch/export.py): export -> load_pretrained is
exact per fixture family, bf16 / fp16 exports are the params rounded, config.json matches what transformers wrote
for the fixture, tied embeddings write no lm_head, sharded exports, and the export entry point on a run directory
(with its one-line errors). No torch."""

import dataclasses
import importlib.util
import json
import os
import pathlib

import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

import scalerl_jax
from scalerl_jax.config import to_yaml
from scalerl_jax.mesh import TRAIN_RULES, Layout, make_mesh
from scalerl_jax.model import make_policy
from scalerl_jax.model.hf import hf_model_config, load_pretrained
from scalerl_jax.model.hf_export import HFExportError, export_pretrained, hf_config
from scalerl_jax.train.checkpoint import RunCheckpointer, config_fingerprint
from scalerl_jax.train.state import init_train_state, make_optimizer
from tests.cli_helpers import exit_error
from tests.pipeline_helpers import tiny_config

ROOT = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILIES = ("llama", "qwen2", "qwen3")
# keys transformers writes that the export leaves out (documented in hf_export.py)
NOT_WRITTEN = {"transformers_version"}


def _load_script():
  spec = importlib.util.spec_from_file_location("export_cli", ROOT.parents[2] / "launch" / "export.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


cli = _load_script()


def flat(params):
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


@pytest.fixture(scope="module")
def loaded():
  return {name: load_pretrained(ROOT / name) for name in FAMILIES}


def test_public_names():
  assert scalerl_jax.export_pretrained is export_pretrained
  from scalerl_jax.model import export_pretrained as again
  assert again is export_pretrained


def exact_round_trip(model, root, name, tmp_path):
  """Exports fixture `name`'s loaded `model`, checks that importing the export gives the same config and params
  bit for bit and that its tensors are the very ones transformers saved (name for name); returns (out dir,
  our tensors)."""
  out = export_pretrained(model.params, model.cfg, tmp_path / name, source_dir=root / name)
  back = load_pretrained(out)
  assert back.cfg == model.cfg
  a, b = flat(model.params), flat(back.params)
  assert a.keys() == b.keys()
  for k in a:
    assert a[k].dtype == b[k].dtype == np.float32 and np.array_equal(a[k], b[k]), k
  ours, theirs = load_file(str(out / "model.safetensors")), load_file(str(root / name / "model.safetensors"))
  assert ours.keys() == theirs.keys()
  assert all(np.array_equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype for k in ours)
  return out, ours


@pytest.mark.parametrize("name", FAMILIES)
def test_export_then_import_is_exact(loaded, name, tmp_path):
  out, _ = exact_round_trip(loaded[name], ROOT, name, tmp_path)
  # and the tokenizer files and special ids carried over
  for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
    assert (out / f).is_file() == (ROOT / name / f).is_file(), f
    if (out / f).is_file():
      assert (out / f).read_bytes() == (ROOT / name / f).read_bytes()
  model, back = loaded[name], load_pretrained(out)
  assert (back.bos_id, back.eos_ids, back.pad_id) == (model.bos_id, model.eos_ids, model.pad_id)


@pytest.mark.parametrize("name", FAMILIES)
def test_config_json_matches_transformers(loaded, name, tmp_path):
  out = export_pretrained(loaded[name].params, loaded[name].cfg, tmp_path, source_dir=ROOT / name)
  ours = json.loads((out / "config.json").read_text())
  theirs = json.loads((ROOT / name / "config.json").read_text())
  assert set(theirs) - set(ours) == NOT_WRITTEN
  assert set(ours) - set(theirs) == set()
  for k in ours:
    assert ours[k] == theirs[k], k
  # without the source: everything but the special ids (which our ModelConfig does not hold)
  bare = hf_config(loaded[name].cfg, name)
  assert {k: v for k, v in theirs.items() if k not in NOT_WRITTEN and not k.endswith("_token_id")} == bare


@pytest.mark.parametrize("name", FAMILIES + ("qwen3_bf16", "qwen3_sharded"))
def test_transformers_loaded_the_exports(name):
  """tools/make_hf_fixtures.py --check-export recorded that transformers loads our export of this fixture and
  reproduces its reference logits, config, tokenizer ids and greedy tokens (tools/README.md)."""
  check = json.loads((ROOT / name / "reference.json").read_text())["export_check"]
  assert check["logits_max_abs_diff"] == 0.0
  assert check["config_equal"] and check["tokenizer_ids_equal"] and check["greedy_equal"]
  assert check["dtype_on_disk"] == ("bfloat16" if name == "qwen3_bf16" else "float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_export_is_the_rounded_params(loaded, dtype, tmp_path):
  model = loaded["qwen3"]
  out = export_pretrained(model.params, model.cfg, tmp_path, dtype=dtype, family="qwen3")
  assert json.loads((out / "config.json").read_text())["dtype"] == dtype
  np_dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
  assert all(v.dtype == np_dtype for v in load_file(str(out / "model.safetensors")).values())
  back = flat(load_pretrained(out).params)
  for k, v in flat(model.params).items():
    assert np.array_equal(back[k], v.astype(np_dtype).astype(np.float32)), k
  # the rounding is what the committed bf16 fixture holds (transformers' own rounding of the same weights)
  if dtype == "bfloat16":
    assert all(np.array_equal(a, b) for a, b in zip(
        *(load_file(str(d / "model.safetensors")).values() for d in (out, ROOT / "qwen3_bf16"))))


def test_tied_embeddings_write_no_lm_head(loaded, tmp_path):
  for name in FAMILIES:
    model = loaded[name]
    out = export_pretrained(model.params, model.cfg, tmp_path / name, family=name)
    names = load_file(str(out / "model.safetensors")).keys()
    assert ("lm_head.weight" in names) == (not model.cfg.tie_embeddings) and "model.embed_tokens.weight" in names
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] == model.cfg.tie_embeddings
  # qwen2 / qwen3 fixtures are tied, llama is not
  assert loaded["qwen3"].cfg.tie_embeddings and not loaded["llama"].cfg.tie_embeddings


def test_sharded_export_reads_back(loaded, tmp_path):
  model = loaded["llama"]
  out = export_pretrained(model.params, model.cfg, tmp_path, family="llama", max_shard_bytes=60_000)
  index = json.loads((out / "model.safetensors.index.json").read_text())
  files = sorted(set(index["weight_map"].values()))
  assert len(files) > 2 and not (out / "model.safetensors").exists()
  assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
  back, want = flat(load_pretrained(out).params), flat(model.params)
  assert all(np.array_equal(back[k], want[k]) for k in want)
  # exporting again unsharded into the same directory leaves no stale index behind
  export_pretrained(model.params, model.cfg, tmp_path, family="llama")
  assert not (out / "model.safetensors.index.json").exists() and len(list(out.glob("model*.safetensors"))) == 1


def test_sharded_params_export_as_the_whole_tensors(loaded, tmp_path):
  """Params spread over an fsdp=4 x tensor=2 mesh are gathered tensor by tensor: the same files as from host."""
  sharded = load_pretrained(ROOT / "qwen2", mesh=make_mesh("fsdp=4,tensor=2"))
  assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
             for x in jax.tree.leaves(sharded.params))
  a = export_pretrained(sharded.params, sharded.cfg, tmp_path / "a", family="qwen2")
  b = export_pretrained(loaded["qwen2"].params, loaded["qwen2"].cfg, tmp_path / "b", family="qwen2")
  assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_refusals(loaded, tmp_path):
  qwen3 = loaded["qwen3"]
  cases = [(dict(family="llama"), "model.qk_norm=True but llama has qk_norm=False (this model exports as qwen3)"),
           (dict(family="gemma"), "family='gemma' is not a Hugging Face family"),
           (dict(), "the Hugging Face family is unknown"),
           (dict(family="qwen3", dtype="int8"), "dtype='int8' is not an export dtype"),
           (dict(source_dir=ROOT / "qwen2"), "does not describe these params"),
           (dict(family="qwen2", source_dir=ROOT / "qwen3"), "model_type='qwen3'")]
  for kw, msg in cases:
    with pytest.raises(HFExportError, match=msg.replace("(", r"\(").replace(")", r"\)")):
      export_pretrained(qwen3.params, qwen3.cfg, tmp_path, **kw)


# ---- launch/export.py on a run directory ----------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A tiny run directory: config.yaml and checkpoints 1 and 2 (distinct params), as the trainer writes them."""
  d = tmp_path_factory.mktemp("run")
  cfg = tiny_config(d)
  (d / "config.yaml").write_text(to_yaml(cfg))
  policy, optimizer = make_policy(cfg.model), make_optimizer(cfg.optimizer)
  layout = Layout(make_mesh("data=1,fsdp=2,tensor=1,expert=1", jax.devices()[:2]), TRAIN_RULES)
  ckpt = RunCheckpointer(d / "checkpoints", cfg.checkpoint.keep)
  states = {}
  for step in (1, 2):
    states[step] = init_train_state(policy, optimizer, layout, seed=step)
    ckpt.save(step, states[step], {"step": step, "fingerprint": config_fingerprint(cfg)})
  ckpt.close()
  return d, {s: flat(st.params) for s, st in states.items()}


@pytest.mark.parametrize("step", [None, 1])
def test_export_cli_latest_and_named(run_dir, step, tmp_path, capsys):
  d, want = run_dir
  argv = [str(d), "--out", str(tmp_path / "hf"), "--family", "llama"] + ([] if step is None else ["--step", "1"])
  assert cli.main(argv) == 0
  printed = capsys.readouterr().out
  assert f"exported checkpoint {step or 2}" in printed
  # a character-tokenizer run has no Hugging Face tokenizer to export: said, with why
  assert ("warning: no Hugging Face tokenizer was exported: the run used the built-in character tokenizer "
          "(data.tokenizer=char)") in printed and not (tmp_path / "hf" / "tokenizer.json").exists()
  got = flat(load_pretrained(tmp_path / "hf").params)
  assert got.keys() == want[step or 2].keys()
  assert all(np.array_equal(got[k], want[step or 2][k]) for k in got)


def test_export_cli_bf16_with_source(run_dir, tmp_path):
  d, want = run_dir
  assert cli.main([str(d), "--out", str(tmp_path), "--family", "llama", "--dtype", "bf16"]) == 0
  got = flat(load_pretrained(tmp_path).params)
  assert all(np.array_equal(got[k], v.astype(ml_dtypes.bfloat16).astype(np.float32)) for k, v in want[2].items())


def test_export_cli_errors(run_dir, tmp_path, capsys):
  d, _ = run_dir
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "config.yaml").write_text((d / "config.yaml").read_text())
  out = ["--out", str(tmp_path / "o")]
  cases = [([str(d), *out], "the run's model was not imported from a Hugging Face checkpoint (no model.pretrained): "
                            "pass --family (llama | qwen2 | qwen3 | qwen3_moe | mixtral) or --source HF_DIR"),
           ([str(d), *out, "--family", "mixtral"], "model.family"),  # an MoE family for a dense run: refused
           ([str(d), *out, "--family", "gemma"], "--family 'gemma' is not a family we export"),
           ([str(empty), *out, "--family", "llama"], f"no checkpoint in {empty / 'checkpoints'}"),
           ([str(tmp_path / "nope"), *out, "--family", "llama"], "config.yaml: no such file"),
           ([str(d), *out, "--family", "llama", "--step", "7"], "no checkpoint 7 in"),
           ([str(d), *out, "--family", "qwen3"], "model.qk_norm=False but qwen3 has qk_norm=True"),
           ([str(d), *out, "--family", "llama", "--dtype", "int8"], "dtype='int8' is not an export dtype"),
           ([str(d), *out, "--source", str(ROOT / "qwen3")], "does not describe these params")]
  for argv, msg in cases:
    err = exit_error(capsys, cli.main, argv)
    assert err.startswith("export.py: error: ") and msg in err and err.count("\n") == 1, (argv, err)
  assert not (empty / "checkpoints").exists()  # a refused export creates nothing in the run directory


@pytest.fixture(scope="module")
def imported_run(tmp_path_factory):
  """A run directory whose model was imported (model.pretrained: the qwen3 fixture), checkpoint 3 holding the
  fixture's params, as RLJob resolves and writes it."""
  d, hf_dir = tmp_path_factory.mktemp("imported"), tmp_path_factory.mktemp("hf") / "qwen3"
  for f in (ROOT / "qwen3").iterdir():
    (hf_dir / f.name).parent.mkdir(exist_ok=True)
    (hf_dir / f.name).write_bytes(f.read_bytes())
  base = tiny_config(d)
  arch = hf_model_config(hf_dir, max_seq_len=base.model.max_seq_len)
  cfg = dataclasses.replace(base, model=dataclasses.replace(arch, pretrained=str(hf_dir)))
  (d / "config.yaml").write_text(to_yaml(cfg))
  policy, optimizer = make_policy(cfg.model), make_optimizer(cfg.optimizer)
  layout = Layout(make_mesh("data=1,fsdp=1,tensor=1,expert=1", jax.devices()[:1]), TRAIN_RULES)
  params = load_pretrained(hf_dir, max_seq_len=cfg.model.max_seq_len).params
  ckpt = RunCheckpointer(d / "checkpoints", cfg.checkpoint.keep)
  ckpt.save(3, init_train_state(policy, optimizer, layout, seed=0, params=params),
            {"step": 3, "fingerprint": config_fingerprint(cfg)})
  ckpt.close()
  return d, hf_dir


def test_export_cli_imported_run_needs_no_flags(imported_run, tmp_path, capsys):
  d, hf_dir = imported_run
  assert cli.main([str(d), "--out", str(tmp_path)]) == 0
  assert "warning" not in capsys.readouterr().out  # the checkpoint's tokenizer went with it
  # the export is the imported checkpoint again: same tensors, same config.json (but transformers_version), same
  # tokenizer files
  ours, theirs = (load_file(str(x / "model.safetensors")) for x in (tmp_path, ROOT / "qwen3"))
  assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)
  c_ours, c_theirs = (json.loads((x / "config.json").read_text()) for x in (tmp_path, ROOT / "qwen3"))
  assert c_ours == {k: v for k, v in c_theirs.items() if k not in NOT_WRITTEN}
  for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    assert (tmp_path / f).read_bytes() == (ROOT / "qwen3" / f).read_bytes()
  # family from model.pretrained: asking for another one is refused; a moved checkpoint needs --source or --family
  err = exit_error(capsys, cli.main, [str(d), "--out", str(tmp_path / "x"), "--family", "qwen2"])
  assert err.startswith("export.py: error: model.qkv_bias=False but qwen2 has qkv_bias=True (this model exports as "
                        "qwen3)")
  moved = hf_dir.with_name("moved")
  hf_dir.rename(moved)
  try:
    err = exit_error(capsys, cli.main, [str(d), "--out", str(tmp_path / "y")])
    assert f"model.pretrained={str(hf_dir)!r} is not a directory (moved?)" in err and err.count("\n") == 1
    assert cli.main([str(d), "--out", str(tmp_path / "z"), "--source", str(moved)]) == 0
    assert (tmp_path / "z" / "tokenizer.json").is_file()
  finally:
    moved.rename(hf_dir)


def test_export_never_writes_over_its_source_or_its_run(imported_run, tmp_path, capsys, monkeypatch):
  """--out the source checkpoint (or a directory holding it), or the run directory: refused, naming the path, before
  anything is written (a bf16 export over the source replaced its fp32 weights silently)."""
  d, hf_dir = imported_run
  before = {f.name: f.read_bytes() for f in hf_dir.iterdir()}
  monkeypatch.chdir(hf_dir)
  for out, msg in [(hf_dir, f"--out {hf_dir} is the source checkpoint {hf_dir}"),
                   (".", f"--out . is the source checkpoint {hf_dir}"),
                   (hf_dir.parent, f"--out {hf_dir.parent} holds the source checkpoint {hf_dir}"),
                   (d, f"--out {d} is the run directory {d}"), (d.parent, f"--out {d.parent} holds the ")]:
    err = exit_error(capsys, cli.main, [str(d), "--out", str(out), "--dtype", "bf16"])
    assert err.startswith("export.py: error: ") and msg in err and err.count("\n") == 1, err
  assert {f.name: f.read_bytes() for f in hf_dir.iterdir()} == before
  with pytest.raises(HFExportError, match=f"out_dir {hf_dir} is the source checkpoint"):
    model = load_pretrained(hf_dir)
    export_pretrained(model.params, model.cfg, hf_dir, source_dir=hf_dir, dtype="bfloat16")
  assert {f.name: f.read_bytes() for f in hf_dir.iterdir()} == before


def test_weights_are_written_with_the_mode_of_the_other_files(loaded, tmp_path):
  """safetensors writes its files 0600; the weights get what the umask gives config.json and the tokenizer files."""
  model = loaded["llama"]
  umask = os.umask(0o027)
  try:
    out = export_pretrained(model.params, model.cfg, tmp_path, source_dir=ROOT / "llama", max_shard_bytes=60_000)
  finally:
    os.umask(umask)
  modes = {f.name: oct(f.stat().st_mode & 0o777) for f in out.iterdir()}
  assert len(modes) > 5 and set(modes.values()) == {"0o640"}, modes


def test_export_after_real_rl_steps_reads_back_as_the_trained_params(tmp_path, capsys, monkeypatch):
  """configs/math_hf.yaml trains the imported qwen3 fixture (with Qwen3's </think> token) for two RL steps (a
  checkpoint at step 2), from relative model.pretrained / data.tokenizer paths; from another working directory,
  export.py with no flags (family and tokenizer from the run's model.pretrained) writes the step-2 params, and a
  resume from the run's config.yaml trains step 3 (config.yaml holds the paths absolute)."""
  from scalerl_jax.config import load_config
  from scalerl_jax.run.job import RLJob
  from tests.test_math_hf import ROOT as REPO, TINY, _rows, thinking_qwen3

  data, held_out = _rows(tmp_path / "train.jsonl", seed=0), _rows(tmp_path / "eval.jsonl", seed=1)
  run, work, elsewhere = tmp_path / "run", tmp_path / "work", tmp_path / "elsewhere"
  thinking_qwen3(work / "ckpt")
  elsewhere.mkdir()
  monkeypatch.chdir(work)
  job = RLJob(load_config(REPO / "configs" / "math_hf.yaml", [f"run_dir={run}", f"data.path={data}",
                                                              f"data.eval_path={held_out}", *TINY, "pipeline.steps=2",
                                                              "model.pretrained=ckpt", "data.tokenizer=ckpt"]),
              progress=False)
  job.run()
  assert job.ckpt.latest_step() == 2
  monkeypatch.chdir(elsewhere)
  saved = load_config(run / "config.yaml")
  assert saved.model.pretrained == saved.data.tokenizer == str(work / "ckpt")
  assert cli.main([str(run), "--out", "hf"]) == 0
  assert "exported checkpoint 2" in capsys.readouterr().out
  got, trained = flat(load_pretrained(elsewhere / "hf").params), flat(job.state.params)
  assert got.keys() == trained.keys() and all(np.array_equal(got[k], trained[k]) for k in trained)
  assert (elsewhere / "hf" / "chat_template.jinja").is_file()
  resumed = RLJob(load_config(run / "config.yaml", ["pipeline.steps=3"]), progress=False)
  resumed.run()
  assert resumed.start_step == 2 and resumed.ckpt.latest_step() == 3
