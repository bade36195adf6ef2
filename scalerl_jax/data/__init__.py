"""Prompts, tasks, rewards and evaluation metrics.

  sources.py     JSONL / Parquet rows -> Records (field mapping, stable ids, bad-row handling)
  tokenizer.py   CharTokenizer (built-in tasks) and HFTokenizer (tokenizer.json + `{prompt}` chat template)
  tasks.py       built-in addition and countdown tasks (train / warm-start-val / eval splits), file datasets
  arith.py       safe integer-expression evaluation for the countdown verifier
  rewards.py     verifiers (exact match, math-verify) and RewardRunner (never raises, never hangs)
  npr.py         No-Positive-Resampling pass-rate history
  pipeline.py    grain prompt pipeline: per-epoch shuffle, NPR filter, process shards, exact resume
  evaluation.py  mean@n, unbiased pass@k, per-prompt success counts
"""
