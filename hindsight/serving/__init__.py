"""Serving credit to RL loops: in-process (`Predictor.credit_fn`), in batch (`hindsight
score`) and over HTTP (`hindsight serve`, `Client`)."""

from hindsight.serving.client import Client

__all__ = ["Client"]
