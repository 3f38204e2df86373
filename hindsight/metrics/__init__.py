"""Metrics over label datasets."""

from hindsight.metrics.summary import summarize, tag_table

__all__ = ["summarize", "tag_table"]
