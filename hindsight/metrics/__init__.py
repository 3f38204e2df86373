"""Metrics over label datasets and over the credit model's predictions."""

from hindsight.metrics.credit_fit import per_tag, prediction_metrics
from hindsight.metrics.honesty import label_honesty
from hindsight.metrics.summary import summarize, tag_table

__all__ = ["label_honesty", "per_tag", "prediction_metrics", "summarize", "tag_table"]
