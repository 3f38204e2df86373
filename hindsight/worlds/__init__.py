"""The bundled text worlds with exact credit, as `hindsight.envs` holds the symbolic ones: the
text world (`world`: a scripted policy writing sentences about a problem), the tool world
(`tool_world`: an agent whose calls a `ToolEnv` executes), their OpenAI-compatible server
(`server`, `running_world`) and the score of labels against their exact credit (`exact`,
`compare_to_exact`). They import the text library and `hindsight.agentic` from above; the
registries below name them as strings (`--tools tool-world`, the exact reference of
`hindsight eval`).
"""

from hindsight._lazy import lazy_exports

_HOMES = {
  "compare_to_exact": "hindsight.worlds.exact",
  "exact_labels": "hindsight.worlds.exact",
  "running_world": "hindsight.worlds.server",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
