"""A small language model of our own: a Flax decoder trained on the text world's traces
(`hindsight lm train`), sampled with a KV cache in one jitted loop, and served by an
OpenAI-compatible `/v1/completions` (`hindsight lm serve`), so the whole text path (label
through the endpoint, train the credit model, evaluate) runs offline (docs/text.md).
"""
