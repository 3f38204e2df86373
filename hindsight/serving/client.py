"""A small client of `hindsight serve` for RL loops in other frameworks (standard library only).

client = Client("http://127.0.0.1:8000")
out = client.credit([{"observations": obs, "actions": acts, "rewards": rews}])
out["credit"][0]   # per-step credit of the first trajectory
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np

from hindsight.errors import HindsightError


def _plain(x):
  if isinstance(x, np.ndarray):
    return x.tolist()
  if isinstance(x, np.generic):
    return x.item()
  raise TypeError(f"cannot send a {type(x).__name__}")


class Client:
  """Blocking HTTP calls to a credit server; a 4xx answer raises HindsightError with the
  server's one-line message."""

  def __init__(
    self,
    url: str = "http://127.0.0.1:8000",
    timeout: float = 30.0,
    admin_token: str | None = None,
  ):
    """admin_token: the server's admin bearer token, sent with `reload` only."""
    self.url = url.rstrip("/")
    self.timeout = timeout
    self._admin_token = admin_token

  def _call(self, method: str, path: str, body: dict | None = None, admin: bool = False) -> dict:
    data = None if body is None else json.dumps(body, default=_plain).encode()
    headers = {"Content-Type": "application/json"}
    if admin and self._admin_token:
      headers["Authorization"] = f"Bearer {self._admin_token}"
    request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
    try:
      with urllib.request.urlopen(request, timeout=self.timeout) as response:
        return json.loads(response.read())
    except urllib.error.HTTPError as e:
      try:
        error = json.loads(e.read()).get("error", e.reason)
        message = error.get("message", e.reason) if isinstance(error, dict) else error
      except (ValueError, AttributeError):
        message = e.reason
      raise HindsightError(f"{path}: {e.code} {message}") from None

  def credit(self, trajectories: list[dict]) -> dict:
    """{"credit", "credit_std", "p_zero", "klass", "model"} for the trajectories (dicts of
    observations, actions, rewards and, multi-agent, agent; lists or NumPy arrays)."""
    return self._call("POST", "/v1/credit", {"trajectories": list(trajectories)})

  def reload(self, checkpoint: str | None = None, step: str | int | None = None) -> dict:
    body = {k: v for k, v in (("checkpoint", checkpoint), ("step", step)) if v is not None}
    return self._call("POST", "/v1/reload", body, admin=True)

  def ready(self) -> bool:
    try:
      return bool(self._call("GET", "/readyz").get("ready"))
    except (HindsightError, OSError):
      return False
