"""Metrics over label datasets and over the credit model's predictions."""

from hindsight.metrics.credit_fit import per_tag, prediction_metrics
from hindsight.metrics.summary import summarize, tag_table

__all__ = ["per_tag", "prediction_metrics", "summarize", "tag_table"]
