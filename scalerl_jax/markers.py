"""The built-in tasks' text markers, low in the import graph: the character tokenizer (data/tokenizer.py), the
tasks' reference completions (data/tasks.py) and the verifiers (rewards/) all read them from here, so rewards/
imports nothing of data/ and a reward worker process that imports a verifier stays light (no tokenizer, no jinja).
"""

END_MARKER = "|"  # end of thinking in the built-in tasks' completions (rollout.interruption.end_marker's default)
EOS_CHAR = "$"  # end of sequence of the built-in character vocabulary
