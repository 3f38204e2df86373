"""The README and docs/ against the code: every command they show names a program, flag and
config field that exists, every link resolves, the pages speak to users (no history), and
the README's Python example names what the package has (tests/test_install.py runs it from
an installed package)."""

import argparse
import ast
import os
import re
import shlex

import pytest
from conftest import ROOT, page_file

from hindsight import cli
from hindsight.config_io import current_name, load_config

_DOCS = sorted(f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
PAGES = ["README.md", *(os.path.join("docs", f) for f in _DOCS)]
# What a page for users does not say: issue numbers, targets met or missed, first person,
# the history of the code. (The CHANGELOG and the closing notes keep that.)
NOT_FOR_USERS = re.compile(
  r"\bissue \d+|\btargets? (met|missed)\b|\(target [<>=\d]|\btarget \d|"
  r"\bI (did|have|left|kept|checked|think)\b|previous commit|\bthe new default\b|"
  r"\bthe old (target|estimator|plain)\b|\bbefore the work queue\b|\.\./shared"
)


def _read(page: str) -> str:
  with open(os.path.join(ROOT, page)) as f:
    return f.read()


def _code_lines(text: str):
  """Lines of fenced code blocks, with continuation backslashes joined ('$ ' dropped)."""
  for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
    joined = re.sub(r"\\\n\s*", " ", block)
    for line in joined.splitlines():
      line = line.strip()
      yield line[2:] if line.startswith("$ ") else line


def _commands(text: str):
  """(program, argv) of every shell command in code blocks and `inline code`."""
  inline = re.findall(
    r"`((?:hindsight|python -m train\.(?:main|rl)|python -m eval\.|python eval/|make) [^`]+)`", text
  )
  for line in [*_code_lines(text), *inline]:
    line = line.split("#")[0].split("|")[0].strip()
    line = re.sub(r"^python -m eval\.(\w+)", r"python eval/\1.py", line)
    for prefix in (
      "hindsight ",
      "python -m train.main ",
      "python -m train.rl ",
      "python eval/",
      "make ",
    ):
      if line.startswith(prefix) and "=" not in line.split()[0]:
        try:
          words = shlex.split(line)
        except ValueError:
          continue
        yield prefix.strip(), words
        break


def _flags(words) -> list[str]:
  return [w.split("=")[0] for w in words if w.startswith("--")]


def _check_config_fields(page: str, words, default: str = "", tmp_dir: str = "") -> None:
  """--config NAME|PATH[:VARIANT] names a shipped config or a file (of the checkout, or one
  the page writes out), and every --config.FIELD=... one of its fields."""
  at = words.index("--config") if "--config" in words else -1
  given = [w.split("=", 1)[1] for w in words if w.startswith("--config=")]
  config = words[at + 1] if at >= 0 else (given[0] if given else default)
  if not config or config.endswith("X.py") or "NAME" in config:
    return  # a placeholder
  path = config.split(":")[0]
  if path.isidentifier():  # a shipped config's name
    cfg = load_config(path)
  elif os.path.isfile(os.path.join(ROOT, path)):
    cfg = load_config(os.path.join(ROOT, path))
  else:  # a file the page shows
    file = os.path.join(tmp_dir, os.path.basename(path))
    with open(file, "w") as f:
      f.write(page_file(page, os.path.basename(path)))
    cfg = load_config(file)
  fields = [w[len("--config.") :].split("=")[0] for w in words if w.startswith("--config.")]
  for name in fields:
    node = cfg
    for part in current_name(name).split("."):
      assert part in node, (page, name)
      node = node[part]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
  parser = cli._parser()
  action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
  return dict(action.choices)


@pytest.mark.parametrize("page", PAGES)
def test_every_command_names_what_exists(page, tmp_path):
  text = _read(page)
  subs = _subparsers()
  with open(os.path.join(ROOT, "Makefile")) as f:
    targets = set(re.findall(r"^([a-z][a-z-]*):", f.read(), flags=re.M))
  checked = 0
  for program, words in _commands(text):
    checked += 1
    if program == "hindsight" and words[1] in ("--help", "-h"):
      continue
    if program == "hindsight":
      assert words[1] in subs, (page, words)
      parser = subs[words[1]]
      nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
      if nested and len(words) > 2:  # `hindsight text-world serve ...`
        assert words[2] in nested[0].choices, (page, words)
        parser = nested[0].choices[words[2]]
      known = {o for a in parser._actions for o in a.option_strings}
      unknown = [f for f in _flags(words[2:]) if f not in known and not f.startswith("--config.")]
      assert not unknown, (page, " ".join(words), unknown)
      if words[1] in ("train", "rl"):
        _check_config_fields(page, words, "rl_reasoning" if words[1] == "rl" else "", tmp_path)
    elif program == "make":
      assert words[1] in targets, (page, words)
    elif program in ("python -m train.main", "python -m train.rl"):
      _check_config_fields(page, words, tmp_dir=tmp_path)
    else:  # python eval/NAME.py
      script = os.path.join(ROOT, "eval", words[1][len("eval/") :])
      assert os.path.isfile(script), (page, words[1])
      with open(script) as f:
        source = f.read()
      flags = [f for f in _flags(words[2:]) if not f.startswith("--config.")]
      unknown = [f for f in flags if f'"{f}"' not in source]
      assert not unknown, (page, " ".join(words), unknown)
      if any(w.startswith("--config.") for w in words) and "--config" in words:
        _check_config_fields(page, words, tmp_dir=tmp_path)  # an experiment's overrides
  if page in ("README.md", "docs/labeling.md", "docs/evaluation.md", "docs/serving.md"):
    assert checked >= 2, page  # the parser above found this page's commands


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve_and_pages_speak_to_users(page):
  text = _read(page)
  for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
    if not target.startswith("http"):
      path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))
      assert os.path.exists(path), (page, target)
  found = [m.group(0) for m in NOT_FOR_USERS.finditer(text)]
  assert not found, (page, found)


def test_readme_is_a_front_page():
  text = _read("README.md")
  lines = text.splitlines()
  assert len(lines) <= 250, len(lines)
  first_block = text[text.index("```") : text.index("```", text.index("```") + 3)]
  assert "make demo" in first_block and "make test" in first_block
  # One current results table, and where it came from.
  assert text.count("| signal |") == 1
  assert re.search(r"commit [0-9a-f]{7}", text), "the table names the commit it came from"


def _readme_example() -> str:
  text = _read("README.md")
  start = text.index("```python", text.index("## In Python"))
  return text[start + len("```python") : text.index("```", start + 3)]


def test_readme_example_names_what_the_package_has():
  """Fast twin of tests/test_install.py's run of it: every import, `hindsight.NAME` and keyword the
  example uses exists (the API it shows), so a rename breaks this tier too."""
  import importlib
  import inspect

  import hindsight

  tree = ast.parse(_readme_example())
  checked = 0
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      module = importlib.import_module(node.module)
      for alias in node.names:
        assert hasattr(module, alias.name), (node.module, alias.name)
        checked += 1
    elif isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "hindsight":
      assert hasattr(hindsight, node.attr), node.attr
      checked += 1
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      owner = getattr(node.func.value, "id", None)
      if owner == "hindsight" and node.keywords:
        params = inspect.signature(getattr(hindsight, node.func.attr)).parameters
        for kw in node.keywords:
          assert kw.arg in params, (node.func.attr, kw.arg)
          checked += 1
  assert checked >= 10, checked  # the example's label, train, load and score calls


def test_help_lists_every_shipped_config():
  """`hindsight train --help` and `hindsight rl --help` name each config the package ships
  (a new one, such as `text_lm`, appears without an edit of the help text)."""
  from hindsight.config_io import shipped_configs

  subs = _subparsers()
  helps = {
    name: next(a.help for a in subs[name]._actions if "--config" in a.option_strings)
    for name in ("train", "rl")
  }
  for config in shipped_configs():
    if config == "generic":
      continue
    command = "rl" if config.startswith("rl_") else "train"
    assert re.search(rf"\b{config}\b", helps[command]), (command, config, helps[command])
  assert "text_lm" in helps["train"] and "rl_text" in helps["rl"]
