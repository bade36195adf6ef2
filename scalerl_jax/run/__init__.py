"""The composition root: `build` makes every part of a run, `trainer` trains on a scored batch, `exchange` is the one
seam that knows the process topology (and the per-step order of collectives), `generator` is a disaggregated
generator process's loop, `job` and `lifecycle` run a trainer process's run, `run_dir` and `start` come before the
job is built (the run directory; the processes)."""
