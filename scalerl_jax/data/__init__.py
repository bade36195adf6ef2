"""Prompts: sources, tokenizers, built-in tasks, the grain prompt stream and No-Positive-Resampling.

  sources.py        JSONL / Parquet rows -> Records (field mapping, stable ids, bad-row handling)
  tokenizer.py      CharTokenizer (built-in tasks), HFTokenizer (tokenizer.json + `{prompt}` template) and
                    PretrainedTokenizer (a Hugging Face checkpoint: special ids, several EOS ids, chat template),
                    GGUFTokenizer (a GGUF file's, built by gguf_vocab.py from its vocabulary and merges)
  gguf_vocab.py     a GGUF file's vocabulary -> tokenizers.Tokenizer (pre-tokenizer by tokenizer.ggml.pre)
  chat.py           the checkpoint's Jinja chat template rendered as transformers renders it
  tasks.py          built-in addition and countdown tasks (train / warm-start-val / eval splits), file datasets
                    (held-out rows by hash, or data.eval_path)
  word_problems.py  English arithmetic word problems answered in \\boxed{} (data.task=word_problems): the built-in
                    task for a pretrained instruct model
  npr.py            No-Positive-Resampling pass-rate history
  prompt_stream.py  grain prompt stream: per-epoch shuffle, NPR filter, process shards, exact resume

Verifiers and success metrics live in `scalerl_jax.rewards`: a task names the verifier of each of its prompts'
tasks (`verifiers`, {prompt task: verifier name}) and rewards.verifier looks it up; data/ imports nothing of
rewards/. The character vocabulary's markers are scalerl_jax/markers.py's.
"""
