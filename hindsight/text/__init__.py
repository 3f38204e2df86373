"""Text traces: label language-model traces by resampling them through an OpenAI-compatible
completions endpoint (docs/text.md).

  hindsight label --env text:FILE.jsonl --endpoint URL --model NAME --out DIR
  hindsight import thought-anchors DIR --out OUT
  hindsight text-world serve | prompts | exact        (a local model with exact credit)

From Python: `read_traces` / `write_traces` and `chunk_text` (the format), `load_verifier`,
`CompletionClient` (async, cached, retried, budgeted), `import_thought_anchors`, the tokenizer
(`Tokenizer`, `train_bpe`), a trace as the credit model reads it (`parse_text_episode`) and
the drift harness's backend of text runs (`open_text`: `hindsight eval` on a text run). The
text world and the tool world (`running_world`, `compare_to_exact`) are `hindsight.worlds`;
agents that call tools, `hindsight.agentic`.
"""

from hindsight._lazy import lazy_exports

_HOMES = {
  "TextStep": "hindsight.text.trace",
  "TextTrace": "hindsight.text.trace",
  "chunk_text": "hindsight.text.trace",
  "read_traces": "hindsight.text.trace",
  "write_traces": "hindsight.text.trace",
  "load_verifier": "hindsight.text.verify",
  "Similarity": "hindsight.text.similarity",
  "CompletionCache": "hindsight.text.client",
  "CompletionClient": "hindsight.text.client",
  "Draw": "hindsight.text.client",
  "Sampling": "hindsight.text.client",
  "TextLabeler": "hindsight.text.labeler",
  "import_thought_anchors": "hindsight.text.thought_anchors",
  "Tokenizer": "hindsight.model.encoders.tokenizer",
  "train_bpe": "hindsight.model.encoders.tokenizer",
  "parse_text_episode": "hindsight.text.episodes",
  "open_text": "hindsight.text.evaluate",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
