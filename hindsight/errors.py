"""The one exception type for bad input.

Every user-facing mistake (a malformed file, a config that does not fit, a request that
cannot be served) raises `HindsightError` with a one-line message naming what is wrong.
The CLI turns it into `hindsight: error: <message>` and exit code 2, never a traceback.
"""


class HindsightError(ValueError):
  """Bad input: the message is one line and names the offending thing."""
