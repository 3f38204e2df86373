"""The extension points: a user's own environment family registered from their module (the
example of docs/environments.md, run as written) and the registry's one-line errors."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from conftest import ROOT

from hindsight.cli import main
from hindsight.data import open_labels
from hindsight.envs import families, make, random_mdp
from hindsight.errors import HindsightError
from hindsight.labeling.source import JAX_ENGINE, PYTHON_ADAPTERS, source_entry
from hindsight.text.options import TextOptions


def _docs_block(page: str, heading: str) -> str:
  """The first ```python block after `heading` on a docs page."""
  with open(f"{ROOT}/docs/{page}") as f:
    text = f.read()
  section = text[text.index(heading) :]
  return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
  """Installs a docs example as an importable module of the user's; the registries and
  sys.modules are restored afterwards (the plug-ins are loaded first, so the registry they
  are restored to has theirs)."""
  from hindsight import plugins
  from hindsight.labeling import source

  plugins.load_all()
  monkeypatch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
  monkeypatch.setattr(source, "_SOURCES", dict(source._SOURCES))
  monkeypatch.syspath_prepend(str(tmp_path))

  def install(name: str, page: str, heading: str) -> None:
    (tmp_path / f"{name}.py").write_text(_docs_block(page, heading))
    monkeypatch.delitem(sys.modules, name, raising=False)

  yield install
  for name in [m for m in sys.modules if m.startswith("my_")]:
    sys.modules.pop(name)


def test_a_family_of_ones_own_registers_from_its_module(user_module, tmp_path, capsys):
  user_module("my_envs", "environments.md", "## Your own environment family")
  assert "my_envs" not in families._FAMILIES
  out = str(tmp_path / "mine")
  argv = ["label", "--env", "my_envs:states=5", "--episodes", "8", "--rollouts", "4",
          "--out", out, "--no-progress"]  # fmt: skip
  assert main(argv) == 0
  family = families.family_of("my_envs:states=5")
  assert family.shifts == ("my_envs:seed=1",) and family.functional
  labels = open_labels(out)
  assert len(labels) == 8 and labels.metadata.env == "my_envs:states=5"
  # The labels are the bundled tabular labeler's on the same MDP: the family only built it.
  env, _ = make("my_envs:states=5")
  assert env.num_actions == 3 and labels.metadata.horizon == env.horizon
  assert all(np.isfinite(np.asarray(labels[i]["credit"])).any() for i in range(8))
  # The options reach the MDP: states=5 builds random_mdp(0, num_states=5), not the default's
  # 6 states, and seed=1 another MDP; the labels' states are that MDP's.
  same = random_mdp(0, num_states=5, num_actions=3, horizon=8)
  assert env.num_states == 5 and make("my_envs")[0].num_states == 6
  np.testing.assert_array_equal(np.asarray(env.mdp.P), np.asarray(same.P))
  assert not np.array_equal(np.asarray(make("my_envs:states=5,seed=1")[0].mdp.P), same.P)
  assert max(int(np.max(labels[i]["observations"])) for i in range(8)) < 5
  # Options it does not know, and job options it does not take, are one line each.
  assert main(["label", "--env", "my_envs:colour=3", "--episodes", "2", "--out", out + "2"]) == 2
  assert "unknown option 'colour=3'" in capsys.readouterr().err
  assert main(["label", "--env", "my_envs", "--episodes", "2", "--horizon", "3",
               "--out", out + "3"]) == 2  # fmt: skip
  err = capsys.readouterr().err.strip()
  assert err == (
    "hindsight: error: --horizon is for gymnax:, gymnasium:, dm_env: environments only, not my_envs"
  ), err


def test_unknown_specs_list_what_is_registered():
  with pytest.raises(HindsightError, match=r"unknown environment 'nowhere_at_all:x' \(known: "
                     r"tabular:PATH\.npz, key_corridor"):  # fmt: skip
    families.family_of("nowhere_at_all:x")
  with pytest.raises(HindsightError, match=r"unknown environment '\./here\.npz'"):
    families.family_of("./here.npz")  # a path is no module to import
  with pytest.raises(HindsightError, match="not functional JAX environments"):
    make("gymnasium:CartPole-v1")
  with pytest.raises(HindsightError, match="registered already"):
    families.register(families.EnvFamily("reasoning", "reasoning", lambda arg, o: None))
  # Every prefix the package used to switch on is a registered family with its options.
  takes = {f.name: f.options for f in families.registered_families()}
  assert takes["gymnax"] == {"policy", "horizon", "return_range"}
  assert takes["gymnasium"] == takes["dm_env"] == {"policy", "horizon", "return_range"}
  assert not takes["text"] and not takes["reasoning"]
  # Who labels each one, and the job options its labeler adds.
  entry = {f.name: source_entry(f) for f in families.registered_families()}
  assert entry["gymnasium"] is entry["dm_env"] is PYTHON_ADAPTERS and PYTHON_ADAPTERS.workers
  assert entry["gymnax"] is entry["reasoning"] is JAX_ENGINE and not JAX_ENGINE.workers
  assert entry["text"].options is TextOptions


def test_a_label_source_of_ones_own_serves_a_family(user_module, tmp_path):
  """docs/labeling.md's example: a family whose label source wraps the JAX engine. The job
  drives it through the LabelSource protocol alone: one timing per chunk, and the labels are
  key_corridor's bit for bit."""
  import hindsight
  from hindsight.labeling.label_source import LabelSource

  user_module("my_sources", "labeling.md", "## Your own label source")
  import my_sources

  n = 130  # two chunks: the chunk size is rounded up to whole blocks of the 8 test devices
  job = hindsight.LabelJob("timed:key_corridor", n, hindsight.LabelConfig(num_rollouts=4),
                           chunk_size=4)  # fmt: skip
  out = hindsight.run_label_job(job, str(tmp_path / "timed"), progress=False)
  made = source_entry(families.family_of("timed:x")).make(job, "")
  assert isinstance(made, LabelSource)
  plain = hindsight.LabelJob("key_corridor", n, hindsight.LabelConfig(num_rollouts=4),
                             chunk_size=4)  # fmt: skip
  ref = hindsight.run_label_job(plain, str(tmp_path / "plain"), progress=False)
  a, b = open_labels(out), open_labels(ref)
  chunk = a.metadata.job_description["chunk_size"]  # rounded up to the devices' blocks
  assert len(my_sources.CHUNK_SECONDS) == -(-n // chunk) >= 2, (my_sources.CHUNK_SECONDS, chunk)
  assert a.metadata.env == "timed:key_corridor"
  for i in range(n):
    for name, value in b[i].items():
      assert np.asarray(a[i][name]).tobytes() == np.asarray(value).tobytes(), (i, name)


def test_an_installed_plugin_is_found_through_its_entry_point(tmp_path, monkeypatch):
  """A package's `hindsight.plugins` entry point is imported when a registry is asked for
  its name (here a tool environment); one that fails to import is a one-line error naming
  the plug-in and its module."""
  import importlib.metadata

  from hindsight import plugins
  from hindsight.agentic import tools
  from hindsight.errors import HindsightError

  (tmp_path / "my_plugin_tools.py").write_text(
    "from hindsight.agentic.tools import register_tool_env\n"
    "from hindsight.worlds.tool_world import ToolWorldEnv\n"
    "register_tool_env('my-tools', lambda: ToolWorldEnv('replay'))\n"
  )
  (tmp_path / "my_broken_plugin.py").write_text("raise RuntimeError('half installed')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  points = [importlib.metadata.EntryPoint(name, value, plugins.ENTRY_POINT_GROUP)
            for name, value in (("my-tools", "my_plugin_tools"),
                                ("my-broken", "my_broken_plugin"))]  # fmt: skip
  real = importlib.metadata.entry_points
  monkeypatch.setattr(importlib.metadata, "entry_points",
                      lambda **kw: points if kw.get("group") == plugins.ENTRY_POINT_GROUP
                      else real(**kw))  # fmt: skip
  monkeypatch.setattr(plugins, "_LOADED", set(plugins._LOADED))
  monkeypatch.setattr(tools, "_TOOL_ENVS", plugins.Registry(tools._TOOL_ENVS))
  assert {"my-tools", "my-broken"} <= set(plugins.declared())
  env = tools.load_tool_env("my-tools")
  assert env.branching == "replay" and "my_plugin_tools" in sys.modules
  with pytest.raises(HindsightError) as e:
    plugins.load("my-broken")
  assert str(e.value) == ("plug-in 'my-broken' (my_broken_plugin) failed to load (half "
                          "installed)")  # fmt: skip
  for name in ("my_plugin_tools", "my_broken_plugin"):
    sys.modules.pop(name, None)
