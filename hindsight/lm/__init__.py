"""Language models (the `llm` extra): a Qwen2 / Llama 3 decoder of Tunix's modules run by one
forward of ours (`backbone`), trained on the text world's traces or fine-tuned from a Hugging
Face folder (`hindsight lm train`, `train`, `hf`), sampled in process (`sample`) and served
with continuous batching at an OpenAI-compatible `/v1/completions` (`engine`, `server`), and
read by the credit model as a step encoder (`credit_encoder`, the `lm_backbone` plug-in), so
the whole text path runs offline and on the models users train (docs/text.md).
"""
