"""Rollout throughput, vLLM vs the transformers reference engine, on multi-turn Connect Four conversations."""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from earl_core.agent import protocol
from earl_core.agent.teacher import protocol_corpus
from earl_core.engines import RolloutEngine, SamplingSpec, make_engine
from earl_core.env.connect_four import Board
from earl_core.models import IM_END, IM_START, create_model, load_policy

DEFAULT_OUT = Path(__file__).parent / "results" / "engine_bench.json"


def user_turns(games: int, turns: int, *, seed: int) -> list[list[str]]:
    """Per game, the user message of each agent turn; both sides play random legal moves."""
    rng = random.Random(seed)
    scripts = []
    for _ in range(games):
        board, last, messages = Board(), None, []
        while len(messages) < turns:
            if board.is_terminal():
                board, last = Board(), None  # a long script just starts the next game
            messages.append(protocol.turn_prompt(board, last))
            board = board.drop(rng.choice(board.legal_columns()))
            if not board.is_terminal():
                last = rng.choice(board.legal_columns())
                board = board.drop(last)
        scripts.append(messages)
    return scripts


def play(engine: RolloutEngine, tokenizer: Any, scripts: list[list[str]], spec: SamplingSpec) -> dict[str, Any]:
    """Run every game turn by turn; each prompt is the previous one + the answer + a new user message."""
    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    system = ids(f"{IM_START}system\n{protocol.system_prompt(1)}{IM_END}\n")
    prompts = [list(system) for _ in scripts]
    generated = prompt_tokens = 0
    seconds = 0.0
    for turn in range(len(scripts[0])):
        for prompt, script in zip(prompts, scripts):
            prompt += ids(f"{IM_START}user\n{script[turn]}{IM_END}\n{IM_START}assistant\n")
        start = time.perf_counter()
        gens = engine.generate(prompts, spec)
        seconds += time.perf_counter() - start
        prompt_tokens += sum(len(p) for p in prompts)
        for prompt, gen in zip(prompts, gens):
            generated += len(gen.token_ids)
            # The answer is closed the way the agent closes it, so the next prompt extends this one.
            prompt += gen.token_ids + ([] if gen.finish_reason == "stop" else ids(IM_END)) + ids("\n")
    return {
        "seconds": seconds,
        "generated_tokens": generated,
        "prompt_tokens": prompt_tokens,
        "tokens_per_s": generated / seconds,
        "final_prompt_len_mean": sum(len(p) for p in prompts) / len(prompts),
    }


def bench_preset(preset: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build `preset` fresh, then run the same workload through each engine (one engine alive at a time)."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_model(preset, Path(tmp) / preset, corpus=protocol_corpus(200, seed=0), seed=0)
        _, tokenizer = load_policy(str(model_dir))
        scripts = user_turns(args.games, args.turns, seed=args.seed)
        spec = SamplingSpec(max_new_tokens=args.new_tokens, temperature=1.0, seed=args.seed)
        warmup = SamplingSpec(max_new_tokens=4, temperature=1.0, seed=1)
        results: dict[str, Any] = {}
        for kind, opts in (("hf", {}), ("vllm", {"kv_cache_gib": 1, "max_model_len": 4096})):
            start = time.perf_counter()
            engine = make_engine(kind, str(model_dir), **opts)
            startup = time.perf_counter() - start
            play(engine, tokenizer, user_turns(2, 2, seed=99), warmup)  # first-call costs are not throughput
            results[kind] = {"startup_s": startup, **play(engine, tokenizer, scripts, spec)}
            engine.close()
        results["ratio_vllm_over_hf"] = results["vllm"]["tokens_per_s"] / results["hf"]["tokens_per_s"]
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", nargs="+", default=["tiny"], help="model presets to build and compare")
    parser.add_argument("--games", type=int, default=32, help="conversations per batch")
    parser.add_argument("--turns", type=int, default=8, help="agent turns per conversation")
    parser.add_argument("--new-tokens", type=int, default=24, help="max new tokens per answer")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the HF engine")
    parser.add_argument("--seed", type=int, default=0, help="games and sampling seed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    args = parser.parse_args()
    # vLLM's CPU worker binds its own OpenMP threads; the HF side gets an explicit, reported count.
    torch.set_num_threads(args.threads)

    report = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "presets": {}}
    for preset in args.presets:
        report["presets"][preset] = bench_preset(preset, args)

    print(f"\n{'preset':<8}{'engine':<8}{'startup s':>10}{'gen s':>9}{'gen tok':>9}{'tok/s':>10}{'prompt tok':>12}")
    for preset, res in report["presets"].items():
        for kind in ("hf", "vllm"):
            r = res[kind]
            print(
                f"{preset:<8}{kind:<8}{r['startup_s']:>10.2f}{r['seconds']:>9.2f}{r['generated_tokens']:>9}"
                f"{r['tokens_per_s']:>10.0f}{r['prompt_tokens']:>12}"
            )
        print(f"{preset:<8}vLLM / HF tokens/s: {res['ratio_vllm_over_hf']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
