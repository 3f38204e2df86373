"""Tool-using LM agents (docs/agents-text.md): what executes an agent's tool calls while its
traces are resampled (`tools`: the environment protocol, its registry, `Branches`) and the
labeler that runs them in every continuation (`labeler.AgentLabeler`). It reads the text
library below it (`hindsight.text`, where the agent-trace format lives: `text.agent_trace`);
nothing there imports it (`--tools` picks the labeler by name).

Not multi-agent credit's agents (`hindsight.labeling.agents`, docs/agents.md).
"""
