"""A model folder's chat template: the Jinja template Hugging Face tokenizers carry
(`tokenizer_config.json`'s `chat_template`, or a `chat_template.jinja` beside it), rendered
as `transformers` renders it (a sandboxed Jinja environment with trim_blocks and
lstrip_blocks, loop controls, the `tojson` filter, `raise_exception` and `strftime_now`), so
`POST /v1/chat/completions` prompts the model exactly as its own tooling would.

  messages [{"role", "content"}]  ->  render(...)  ->  the prompt text (start tokens included
                                                       where the template writes them)
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os

from hindsight.errors import HindsightError

TOKENIZER_CONFIG, TEMPLATE_FILE = "tokenizer_config.json", "chat_template.jinja"


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """The template's source and the special tokens it may name (bos_token, eos_token, ...)."""

  source: str
  tokens: tuple[tuple[str, str], ...] = ()

  def to_json(self) -> dict:
    return {"source": self.source, "tokens": dict(self.tokens)}

  @classmethod
  def from_json(cls, record: dict | None) -> ChatTemplate | None:
    if not record:
      return None
    return cls(str(record["source"]), tuple(sorted(record.get("tokens", {}).items())))

  def render(self, messages: list[dict], add_generation_prompt: bool = True,
             tools: list | None = None) -> str:  # fmt: skip
    """The prompt of a conversation (offering `tools`, OpenAI tool schemas, where given); a
    template that refuses it (its `raise_exception`, a malformed message) is a one-line
    HindsightError."""
    try:
      import jinja2
    except ImportError:
      raise HindsightError("a chat template needs jinja2 (pip install 'hindsight[llm]')") from None

    try:
      extra = {"tools": tools} if tools else {}
      return _compiled(self.source).render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        **extra,
        **dict(self.tokens),
      )
    except jinja2.TemplateError as e:
      raise HindsightError(f"the chat template refused the messages ({e})") from None


def token_text(value) -> str | None:
  """A special token of tokenizer_config.json: a string or an AddedToken record."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


def read_chat_template(path: str) -> ChatTemplate | None:
  """The chat template of a Hugging Face folder (module docstring), or None without one."""
  config = {}
  file = os.path.join(path, TOKENIZER_CONFIG)
  if os.path.isfile(file):
    try:
      with open(file) as f:
        config = json.load(f)
    except (OSError, ValueError):
      raise HindsightError(f"{file}: not JSON") from None
  source = config.get("chat_template")
  if isinstance(source, list):  # named templates: the default one
    named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
    source = named.get("default")
  if os.path.isfile(os.path.join(path, TEMPLATE_FILE)):
    with open(os.path.join(path, TEMPLATE_FILE)) as f:
      source = f.read()
  if not isinstance(source, str) or not source:
    return None
  tokens = {k: token_text(v) for k, v in config.items() if k.endswith("_token")}
  return ChatTemplate(source, tuple(sorted((k, v) for k, v in tokens.items() if v)))


def load_chat_template(path: str) -> ChatTemplate:
  """The chat template at `path`: a Hugging Face model folder (`read_chat_template`), its
  tokenizer_config.json, or a Jinja file; a one-line error where there is none."""
  if os.path.isdir(path):
    template = read_chat_template(path)
    if template is None:
      raise HindsightError(f"chat template {path}: the folder has no chat template "
                           f"({TOKENIZER_CONFIG}'s chat_template, or {TEMPLATE_FILE})")  # fmt: skip
    return template
  if os.path.basename(path) == TOKENIZER_CONFIG:
    return load_chat_template(os.path.dirname(path) or ".")
  try:
    with open(path) as f:
      return ChatTemplate(f.read())
  except OSError as e:
    raise HindsightError(f"chat template {path}: cannot read it ({e.strerror or e})") from None


@functools.lru_cache(maxsize=4)
def _compiled(source: str):
  import jinja2
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  def raise_exception(message):
    raise jinja2.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip

  env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
  )
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  try:
    return env.from_string(source)
  except jinja2.TemplateSyntaxError as e:
    raise HindsightError(f"the chat template does not compile ({e})") from None
