"""Prompt pipeline: epochs are permutations, resume is exact, NPR acts from the next epoch, shards are disjoint."""

import dataclasses
import json
import logging

import pytest

from tests.fixtures import make_fixtures
from scalerl_jax.config import DataConfig, NPRConfig
from scalerl_jax.data.npr import NPRState
from scalerl_jax.data.prompt_stream import PromptStream, encode_records
from scalerl_jax.data.sources import DataError, Record
from scalerl_jax.data.tasks import AdditionTask, make_task
from scalerl_jax.data.tokenizer import CharTokenizer, make_tokenizer

N = 40
RECORDS = AdditionTask(2, num_train=N, num_eval=8, num_warmstart_val=4).train_records()
CFG = DataConfig(prompts_per_step=7, seed=3)


def _pipe(cfg=CFG, records=RECORDS, npr=None, **kw):
  return PromptStream(records, cfg, CharTokenizer(), 16, npr=npr, **kw)


def _ids(batches):
  return [p.prompt_id for b in batches for p in b]


def _take(pipe, n):
  return [pipe.next_batch() for _ in range(n)]


def test_batches_are_exact_and_each_epoch_is_a_permutation():
  pipe = _pipe()
  batches = _take(pipe, 12)  # 84 prompts: epochs 0 and 1 whole, 4 of epoch 2
  assert all(len(b) == 7 for b in batches)
  stream = _ids(batches)
  all_ids = sorted(r.prompt_id for r in RECORDS)
  assert sorted(stream[:N]) == all_ids and sorted(stream[N:2 * N]) == all_ids  # none twice, none lost
  assert stream[:N] != stream[N:2 * N]  # reshuffled per epoch
  assert pipe.epoch == 2
  p = batches[0][0]
  assert p.tokens.dtype.name == "int32" and p.tokens[0] == CharTokenizer.bos_id and len(p.tokens) == 1 + len(p.text)


def test_order_is_deterministic_given_the_seed():
  assert _ids(_take(_pipe(), 8)) == _ids(_take(_pipe(), 8))
  assert _ids(_take(_pipe(), 8)) != _ids(_take(_pipe(dataclasses.replace(CFG, seed=4)), 8))


@pytest.mark.parametrize("stop_after", [1, 3, 5, 6, 11])  # mid-epoch, around and across epoch boundaries
def test_resume_gives_exactly_the_remaining_sequence(stop_after):
  pipe = _pipe()
  head = _take(pipe, stop_after)
  state = json.loads(json.dumps(pipe.get_state()))  # through a checkpoint file
  rest = _ids(_take(pipe, 8))
  resumed = _pipe()
  resumed.set_state(state)
  assert _ids(_take(resumed, 8)) == rest
  assert _ids(head) + rest == _ids(_take(_pipe(), stop_after + 8))


def test_npr_acts_from_the_next_epoch_and_survives_a_checkpoint():
  npr_cfg = NPRConfig(threshold=0.9)
  npr = NPRState(npr_cfg)
  pipe = _pipe(npr=npr)
  first = _take(pipe, 2)  # 14 prompts of epoch 0
  seen = set(_ids(first))
  unseen = [r.prompt_id for r in RECORDS if r.prompt_id not in seen]
  solved = sorted(seen)[:3] + unseen[:3]  # three already served, three still to come this epoch
  npr.update(solved, [1.0] * 6)
  npr.update(unseen[3:5], [0.5, 0.5])  # not solved
  checkpoint = json.loads(json.dumps({"data": pipe.get_state(), "npr": npr.state_dict()}))
  rest = _ids(_take(pipe, 10))  # to 84 prompts: the rest of epoch 0, all of epoch 1, part of epoch 2
  epoch0 = _ids(first) + rest[:N - 14]
  assert sorted(epoch0) == sorted(r.prompt_id for r in RECORDS)  # solved prompts still served in epoch 0
  epoch1 = rest[N - 14:N - 14 + N - 6]
  assert sorted(epoch1) == sorted(r.prompt_id for r in RECORDS if r.prompt_id not in solved)
  assert pipe.epoch == 2 and pipe.epoch_size == N - 6

  npr2 = NPRState(npr_cfg)
  npr2.load_state_dict(checkpoint["npr"])
  resumed = _pipe(npr=npr2)
  resumed.set_state(checkpoint["data"])
  assert _ids(_take(resumed, 10)) == rest


def test_npr_updates_during_an_epoch_do_not_change_it_even_across_a_resume():
  npr_cfg = NPRConfig(threshold=0.9)
  npr = NPRState(npr_cfg)
  pipe = _pipe(npr=npr)
  _take(pipe, 6)  # 42 prompts: epoch 1 has started with no prompt removed
  assert pipe.epoch == 1
  later = _ids(_take(pipe, 1))
  npr.update(later, [1.0] * 7)  # solved during epoch 1
  checkpoint = json.loads(json.dumps({"data": pipe.get_state(), "npr": npr.state_dict()}))
  rest = _ids(_take(pipe, 6))
  npr2 = NPRState(npr_cfg)
  npr2.load_state_dict(checkpoint["npr"])
  resumed = _pipe(npr=npr2)
  resumed.set_state(checkpoint["data"])
  assert _ids(_take(resumed, 6)) == rest  # epoch 1 replays with its own (empty) snapshot, epoch 2 filtered
  assert resumed.epoch == 2 and resumed.epoch_size == N - 7


def test_fully_filtered_dataset_is_a_clear_error():
  npr = NPRState(NPRConfig(threshold=0.9))
  pipe = _pipe(npr=npr)
  npr.update([r.prompt_id for r in RECORDS], [1.0] * N)
  _take(pipe, 5)  # 35 of the 40 prompts of epoch 0 still come
  with pytest.raises(DataError, match="epoch 1: no training prompts left.*40 of 40 were removed by No-Positive"):
    pipe.next_batch()


def test_process_shards_are_disjoint_equal_and_cover_the_epoch():
  records = RECORDS[:39]  # odd: one prompt per epoch is left out so both processes see 19
  cfg = dataclasses.replace(CFG, prompts_per_step=6)
  shards = [_pipe(cfg, records, process_index=i, process_count=2) for i in range(2)]
  assert all(s.batch_size == 3 and s.epoch_size == 19 for s in shards)
  a, b = (_ids(_take(s, 12))[:19] for s in shards)  # epoch 0 of each
  assert not set(a) & set(b) and len(set(a) | set(b)) == 38
  with pytest.raises(ValueError, match="not divisible by 4 processes"):
    _pipe(cfg, records, process_index=0, process_count=4)


def test_state_from_another_dataset_or_shard_is_rejected():
  state = _pipe().get_state()
  with pytest.raises(DataError, match="different training prompts, data.seed or process sharding"):
    _pipe(dataclasses.replace(CFG, seed=9)).set_state(state)
  with pytest.raises(DataError, match="restore the NPR state"):
    _pipe(npr=NPRState(NPRConfig())).set_state(dict(state, npr_removed=2))


def test_long_prompts_error_truncate_skip():
  tok = CharTokenizer()
  records = [Record("short", "1+2=", "3", "f.jsonl:line 1"), Record("long", "1234567890+1=", "1234567891",
                                                                   "f.jsonl:line 2")]
  with pytest.raises(DataError, match="f.jsonl:line 2: prompt field: 14 tokens exceed rollout.max_prefill_len=8"):
    encode_records(records, tok, 8, "error")
  prompts, counts = encode_records(records, tok, 8, "truncate")
  assert counts == {"truncated_prompts": 1, "skipped_long_prompts": 0}
  assert tok.decode(prompts[1].tokens) == "7890+1=" and len(prompts[1].tokens) == 8
  assert prompts[1].tokens[0] == tok.bos_id  # BOS kept, the start of the text dropped
  prompts, counts = encode_records(records, tok, 8, "skip")
  assert [p.prompt_id for p in prompts] == ["short"] and counts["skipped_long_prompts"] == 1
  pipe = PromptStream(records, dataclasses.replace(CFG, long_prompts="skip"), tok, 8)
  assert pipe.metrics()["data/skipped_long_prompts"] == 1 and _ids([pipe.next_batch()]) == ["short"] * 7
  with pytest.raises(DataError, match="all 1 training prompts were skipped"):
    PromptStream(records[1:], dataclasses.replace(CFG, long_prompts="skip"), tok, 8)
  with pytest.raises(DataError, match="empty"):
    PromptStream([], CFG, tok, 8)


def test_file_dataset_with_a_chat_template_end_to_end(tmp_path):
  rows = make_fixtures.gsm8k_rows(50)
  rows[7] = {"question": 42, "answer": "1"}  # a bad row, skipped and counted
  path = make_fixtures.write_jsonl(tmp_path / "g.jsonl", rows)
  tok_path = make_fixtures.write_tokenizer_json(tmp_path / "tokenizer.json")
  cfg = DataConfig(task="file", path=str(path), prompt_field="question", num_eval=9, skip_bad_rows=True,
                   tokenizer=str(tok_path), chat_template="<|user|> {prompt} <|assistant|>", prompts_per_step=8,
                   long_prompts="truncate")
  task, tok = make_task(cfg), make_tokenizer(cfg)
  assert task.skipped_rows == 1 and len(task.train_records()) == 40
  pipe = PromptStream(task.train_records(), cfg, tok, 16)
  batch = pipe.next_batch()
  assert len(batch) == 8 and all(len(p.tokens) <= 16 and p.tokens[-1] == tok.token_id("<|assistant|>") for p in batch)
  assert pipe.counts["truncated_prompts"] > 0
  assert not {p.text for p in batch} & {r.text for r in task.eval_records()}


def test_npr_leaving_a_small_remainder_is_warned_once_per_threshold(caplog):
  npr = NPRState(NPRConfig(threshold=0.9))
  pipe = _pipe(npr=npr)
  ids = [r.prompt_id for r in RECORDS]
  with caplog.at_level(logging.WARNING, logger="scalerl_jax.data.prompt_stream"):
    npr.update(ids[:19], [1.0] * 19)  # 21 of 40 left: more than half, no warning
    _take(pipe, 6)
    assert pipe.epoch == 1 and not caplog.records
    npr.update(ids[19:31], [1.0] * 12)  # 9 left: under 1/2 and 1/4 at once: one warning, the smaller
    _take(pipe, 3)
    assert pipe.epoch == 2 and len(caplog.records) == 1
    assert "removed 31 of the 40 training prompts: epoch 2 holds the 9 (22 %)" in caplog.records[0].getMessage()
    _take(pipe, 3)  # epochs 3 and 4 with the same 9: warned already
    assert pipe.epoch >= 3 and len(caplog.records) == 1
    npr.update(ids[31:37], [1.0] * 6)  # 3 left: under 1/10
    _take(pipe, 3)
    assert len(caplog.records) == 2 and "holds the 3 (8 %)" in caplog.records[1].getMessage()
  second = _pipe(npr=NPRState(NPRConfig(threshold=0.9)), process_index=1, process_count=2, batch_size=3)
  second.npr.update(ids[:37], [1.0] * 37)
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="scalerl_jax.data.prompt_stream"):
    _take(second, 8)  # 20 prompts of epoch 0 on this process, then the epoch of 3: only process 0 warns
  assert second.epoch >= 1 and not caplog.records
