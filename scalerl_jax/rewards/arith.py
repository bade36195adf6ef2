"""Safe evaluation of tiny integer expressions (the countdown task's answers); never `eval`.

Grammar (no unary minus, no leading zeros, at most MAX_LEN characters):
    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := NUMBER | '(' expr ')'
Division must be exact (the result stays an integer); anything else raises ValueError.
"""

from __future__ import annotations

MAX_LEN = 64


def evaluate(text: str) -> tuple[int, list[int]]:
  """(value, the number literals in order of appearance); ValueError if `text` is not a valid expression."""
  if not text or len(text) > MAX_LEN:
    raise ValueError(f"expression length {len(text)} not in [1, {MAX_LEN}]")
  literals: list[int] = []
  pos = 0

  def peek() -> str:
    return text[pos] if pos < len(text) else ""

  def factor() -> int:
    nonlocal pos
    if peek() == "(":
      pos += 1
      value = expr()
      if peek() != ")":
        raise ValueError(f"expected ')' at {pos} in {text!r}")
      pos += 1
      return value
    start = pos
    while peek().isdigit() and peek() in "0123456789":
      pos += 1
    if start == pos:
      raise ValueError(f"expected a number at {pos} in {text!r}")
    digits = text[start:pos]
    if len(digits) > 1 and digits[0] == "0":
      raise ValueError(f"leading zero in {digits!r}")
    literals.append(int(digits))
    return literals[-1]

  def term() -> int:
    nonlocal pos
    value = factor()
    while peek() in ("*", "/"):
      op = peek()
      pos += 1
      rhs = factor()
      if op == "*":
        value *= rhs
      elif rhs == 0 or value % rhs:
        raise ValueError(f"inexact division {value}/{rhs}")
      else:
        value //= rhs
    return value

  def expr() -> int:
    nonlocal pos
    value = term()
    while peek() in ("+", "-"):
      op = peek()
      pos += 1
      value = value + term() if op == "+" else value - term()
    return value

  value = expr()
  if pos != len(text):
    raise ValueError(f"unexpected {text[pos]!r} at {pos} in {text!r}")
  return value, literals
