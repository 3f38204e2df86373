"""Experiment configs: `get_config(arg)` returns an ml_collections.ConfigDict."""
