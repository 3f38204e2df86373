"""`hindsight text-world serve | prompts | exact`: the text world, a local model whose credit is
exact (docs/text.md), and with `--tools` the tool world, an agent whose tool calls an
environment executes (docs/agents-text.md)."""

from __future__ import annotations

from hindsight.cli.parser import Parser

NAME = "text-world"
HELP = "the text world: a local model with exact credit"


def add_parser(sub):
  tw = sub.add_parser(NAME, help=HELP)
  tw_sub = tw.add_subparsers(dest="world_command", required=True, parser_class=Parser)
  tws = tw_sub.add_parser("serve", help="serve it at /v1/completions (model hindsight-text-world)")
  tws.add_argument("--host", default="127.0.0.1", help="interface to listen on")
  tws.add_argument("--port", type=int, default=8100, help="port")
  tws.add_argument("--tools", action="store_true",
                   help="serve the tool world's agent (hindsight-tool-world) instead")  # fmt: skip
  twp = tw_sub.add_parser("prompts", help="write N problems as prompt-only traces (JSONL)")
  twp.add_argument("--episodes", type=int, required=True, help="number of problems N")
  twp.add_argument("--seed", type=int, default=0, help="seed of the problems")
  twp.add_argument("--max-count", type=int, default=0,
                   help="box counts 1 .. N (the small LM's); 0: the world's own")  # fmt: skip
  twp.add_argument("--tools", action="store_true", help="the tool world's tasks instead")
  twp.add_argument("--out", required=True, help="output JSONL file")
  twe = tw_sub.add_parser("exact", help="exact credit of the world's traces in a label dataset")
  twe.add_argument("dir", help="a `hindsight label --env text:...` output against the world")
  twe.add_argument("--out", required=True, help="output JSON (per-trace exact labels, z-scores)")
  return tw


def interrupted(args) -> str:
  """What Ctrl-C says: the server stopped (nothing to resume)."""
  return "stopped" if args.world_command == "serve" else "interrupted"


def run(args) -> int:
  from hindsight.worlds import world

  if args.world_command == "serve":
    from hindsight.worlds.server import serve_world

    serve_world(args.host, args.port, args.tools)
    return 0
  if args.world_command == "prompts":
    from hindsight.errors import HindsightError
    from hindsight.text.trace import write_traces

    if args.episodes < 1:
      raise HindsightError(f"--episodes must be >= 1, got {args.episodes}")
    if args.max_count < 0:
      raise HindsightError(f"--max-count must be >= 0, got {args.max_count}")
    if args.tools:
      from hindsight.worlds import tool_world

      most = args.max_count or tool_world.MOST
      write_traces(args.out, tool_world.prompt_traces(args.seed, args.episodes, most))
      print(f"prompts: {args.out}")
      return 0
    counts = (1, args.max_count + 1) if args.max_count else world.COUNTS
    write_traces(args.out, world.prompt_traces(args.seed, args.episodes, counts))
    print(f"prompts: {args.out}")
    return 0
  from hindsight.files import write_json
  from hindsight.worlds.exact import compare_to_exact, exact_summary_text

  report = compare_to_exact(args.dir)
  write_json(args.out, report)
  print(exact_summary_text(report))
  return 0
