"""The one base class of user errors."""


class UserError(Exception):
  """A problem the user can fix (a config key, a data file, a mesh spec, a resume); entry points print its message
  as one line instead of a traceback."""


def user_error(exc: BaseException):
  """`exc` itself or the first UserError in its chain of causes (a generator-thread failure wraps the error it
  caught in a PipelineError); None when the chain holds none."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    if isinstance(exc, UserError):
      return exc
    seen.add(id(exc))
    exc = exc.__cause__ or exc.__context__
  return None
