"""The one base class of user errors."""


class UserError(Exception):
  """A problem the user can fix (a config key, a data file, a mesh spec, a resume); entry points print its message
  as one line instead of a traceback."""
