"""RL of a language model on per-step credit (`hindsight rl --config rl_text`, docs/rl.md "RL
on a language model"): GRPO with Tunix's loss on per-token advantages built from a per-step
credit source, measured on fresh prompts against credit resampled from the policy itself."""
