"""Arithmetic word problems in English: the built-in task for a pretrained instruct model (data.task=word_problems).

One-step problems: a person, a kind of object and two numbers joined by one of + - * / ("Mia has 47 marbles. She
gets 25 more. How many marbles does Mia have now?"). The knob `digits` (data.digits) is the largest operand's
digit count (of a sum's, a difference's, a product's other factor, a quotient); a product's first factor and a
divisor have one digit and quotients are exact, so every answer is a whole number the model can reach without a
calculator. Each prompt ends with the instruction to give the final answer in \\boxed{}; the verifier is
rewards.verifiers.boxed_answer_reward (1 for the right answer boxed, 0.5 for it unboxed, by math-verify; 0 for a
wrong one), so the task teaches the format as well as the arithmetic. The prompt is plain text: the tokenizer
renders it with the model's chat template as one user turn, and there is no thinking marker.

The reference completion ("47 + 25 = 72. The answer is \\boxed{72}.") is for a supervised warm start, which a
pretrained model does not need; the splits are those of every built-in task (tasks.py).
"""

from __future__ import annotations

import numpy as np

from scalerl_jax.data.sources import DataError

NAMES = ("Mia", "Liam", "Ava", "Noah", "Emma", "Omar", "Zoe", "Ravi", "Lena", "Kai", "Sofia", "Ben", "Aisha", "Leo",
         "Maya", "Tom", "Nora", "Ivan", "Chloe", "Sam")
PRONOUNS = {"Mia": "She", "Ava": "She", "Emma": "She", "Zoe": "She", "Lena": "She", "Sofia": "She", "Aisha": "She",
            "Maya": "She", "Nora": "She", "Chloe": "She", "Sam": "They"}
ITEMS = ("marbles", "stickers", "apples", "books", "coins", "pencils", "stamps", "cookies", "shells", "cards")
INSTRUCTION = "Give the final answer as \\boxed{number}."

# op -> templates over {n} (name), {p} (pronoun), {has} / {does} (agreeing with it), {i} (items), {a}, {b}
TEMPLATES = {
    "+": ("{n} has {a} {i}. {p} {gets} {b} more. How many {i} does {n} have now?",
          "A box holds {a} {i} and a bag holds {b} {i}. How many {i} are there in all?"),
    "-": ("{n} has {a} {i}. {p} {gives} {b} of them to a friend. How many {i} does {n} have left?",
          "There are {a} {i} on a shelf. {n} takes {b} of them. How many {i} are still on the shelf?"),
    "*": ("{n} has {a} bags with {b} {i} in each bag. How many {i} does {n} have?",
          "Each of {a} children has {b} {i}. How many {i} do the children have altogether?"),
    "/": ("{n} shares {a} {i} equally among {b} friends. How many {i} does each friend get?",
          "{a} {i} are packed into {b} boxes with the same number in each box. How many {i} are in each box?"),
}
OPS = tuple(TEMPLATES)


class WordProblemTask:
  """Mixed into tasks._BuiltinTask (tasks.py builds it): the problems, their text, answer and reference."""

  name = "word_problems"

  def _check_knob(self, digits: int) -> None:
    if not 1 <= digits <= 4:
      raise DataError(f"data.digits must be in [1, 4] for word_problems, got {digits}")
    self.digits = digits

  def _sample(self, rng: np.random.Generator, m: int) -> list[tuple]:
    hi, out = 10**self.digits, []
    op_M = rng.integers(0, len(OPS), m)
    x_M2 = rng.integers(2, max(hi, 10), (m, 2))
    small_M = rng.integers(2, 10, m)
    for op_i, (x, y), s, name, item, form in zip(op_M, x_M2.tolist(), small_M.tolist(),
                                                 rng.integers(0, len(NAMES), m), rng.integers(0, len(ITEMS), m),
                                                 rng.integers(0, 2, m)):
      op = OPS[op_i]
      if op == "-":
        x, y = max(x, y), min(x, y)
        if x == y:
          x += 1
      elif op == "*":
        x, y = s, x  # one factor of one digit
      elif op == "/":
        x, y = s * x, s  # a one-digit divisor, an exact quotient
      out.append((op, int(x), int(y), NAMES[name], ITEMS[item], int(form)))
    return out

  def _text(self, p: tuple) -> str:
    op, a, b, name, item, form = p
    pronoun = PRONOUNS.get(name, "He")
    plural = pronoun == "They"
    text = TEMPLATES[op][form].format(n=name, p=pronoun, i=item, a=a, b=b, gets="get" if plural else "gets",
                                      gives="give" if plural else "gives")
    return f"{text} {INSTRUCTION}"

  def _answer(self, p: tuple) -> str:
    op, a, b = p[:3]
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op])

  def _solution(self, p: tuple) -> str:
    op, a, b = p[:3]
    result = self._answer(p)
    return f"{a} {op.replace('*', '×').replace('/', '÷')} {b} = {result}. The answer is \\boxed{{{result}}}."
