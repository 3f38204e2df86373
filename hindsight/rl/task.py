"""What an RL run trains: the environment, the learner pi_theta and its features.

The learner is a `NeuralPolicy` over the environment's observations. With `policy.prior`
it starts *as* the environment's scripted behaviour policy (its log-probabilities are the
logits' offset and the MLP's last layer starts at zero), so the environment's structure is there
at update 0: on `reasoning` the learner also reads its own competence c (`policy.latent`),
which raises restating, verifying and searching exactly as the scripted policy does, while
the trace a credit model or PRM sees never shows c. Decorative steps then co-occur with
success without causing it: a signal that can be fooled has something to fool it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ml_collections import ConfigDict

from hindsight.envs import make
from hindsight.envs.base import Environment
from hindsight.envs.reasoning import Reasoning, competence_features
from hindsight.policies.neural import NeuralPolicy, observation_features

PyTree = Any


@dataclasses.dataclass
class Task:
  env: Environment
  env_params: PyTree
  policy: NeuralPolicy  # a seed's theta_0: policy.init_params(key)


def make_task(config: ConfigDict) -> Task:
  env, scripted = make(config.env, horizon=int(config.horizon) or None)
  latent = isinstance(env, Reasoning) and bool(config.policy.latent)
  features = competence_features(env) if latent else observation_features(env)
  policy = NeuralPolicy(
    env,
    hidden=tuple(config.policy.hidden),
    prior=scripted if config.policy.prior else None,
    features=features,
    seed=int(config.seed),
  )
  return Task(env, env.default_params(), policy)
