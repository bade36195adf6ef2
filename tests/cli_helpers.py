"""Shared by the entry-point tests: call a `main(argv)` that must fail with one line, exit code 2."""

import pytest


def exit_error(capsys, main, argv) -> str:
  """stderr of `main(argv)`, which must exit with code 2 (a user error)."""
  with pytest.raises(SystemExit) as info:
    main(argv)
  assert info.value.code == 2
  return capsys.readouterr().err
