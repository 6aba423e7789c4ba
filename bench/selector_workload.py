"""The learner-stage selector benches' shared parts: the growing-context workload, per-range summaries, the ratios
against the static layouts and the printed table (selector_bench.py on Ray workers, gpu_selector_bench.py on one
GPU). No Ray import here: the GPU machine has none."""

from __future__ import annotations

import gc
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import AutoConfig, AutoTokenizer

from earl_core import events as ev
from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import GameSpec, RunnerLimits, play_episodes
from earl_core.engines.base import Generation
from earl_core.config import AlgoConfig, ParallelismConfig
from earl_core.env.opponents import HeuristicOpponent, RandomOpponent
from earl_core.parallel.layout import Layout
from earl_core.parallel.memory import GIB, ModelShape
from earl_core.parallel.planner import LayoutPlanner, StageTarget
from earl_core.rl.learner import Learner

FILLER = "let me look at each column and the threats on the board before I answer "


def thinking_policy(encoder: ChatEncoder, think_tokens: int, seed: int):  # noqa: ANN201 - a runner Policy
    """Heuristic moves, each answer preceded by ``think_tokens`` tokens of thinking (trained on like any
    agent token, as a thinking agent's would be)."""
    rng = random.Random(seed)
    teacher = HeuristicOpponent()
    filler = encoder.tokenizer.encode(FILLER * (1 + think_tokens // 8), add_special_tokens=False)[:think_tokens]

    def act(episodes: list[Episode]) -> list[Generation]:
        out = []
        for ep in episodes:
            answer = encoder.tokenizer.encode(" " + protocol.answer_text(teacher.choose(ep.board, rng)),
                                              add_special_tokens=False)
            ids = filler + answer + [encoder.im_end]
            out.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"))
        return out

    return act


def workload(model_dir: Path, contexts: list[int], games: int, seed: int) -> list[list[dict[str, Any]]]:
    """One list of game records per iteration; iteration i's games run until the context limit contexts[i]
    (a game stops at the first turn whose answer would not fit; the protocol's first turn alone is ~300
    tokens, so that is the shortest game there is)."""
    encoder = ChatEncoder(AutoTokenizer.from_pretrained(model_dir))
    out = []
    for i, limit in enumerate(contexts):
        think = max(0, limit // 12 - 8)  # long enough that games reach the limit instead of ending early
        specs = [GameSpec(index=g, group=g // 2, agent_side=1 + g % 2, opponent=RandomOpponent(), seed=seed + 1000 * i + g)
                 for g in range(games)]
        limits = RunnerLimits(max_invalid=1, max_context=limit, max_new_tokens=think + 16)
        episodes = play_episodes(specs, thinking_policy(encoder, think, seed + i), encoder, limits=limits)
        out.append([ep.record() for ep in episodes])
    return out


def static_layouts(workers: int, micro_batches: list[int], model_dir: Path, *, fsdp: bool = False) -> list[Layout]:
    """Every layout of the train stage the trainer can run: each TP x DP split of the workers the model allows
    (with ``fsdp`` also DP sharded with FSDP), each micro-batch, activation checkpointing off and on (the
    experience stage uses the same split and micro-batch)."""
    shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(model_dir).to_dict())
    cfg = ParallelismConfig(mode="auto", micro_batches=",".join(map(str, micro_batches)), train_fsdp=fsdp)
    planner = LayoutPlanner(cfg, shape=shape, workers=workers, default_micro_batch=1, emit=lambda e: None)
    return sorted(planner.candidates("train"), key=lambda c: (c.tp, c.shard, c.micro_batch, c.checkpointing))


class Trainer(StageTarget, Protocol):
    """What the benches train with: the Ray trainer group, or one in-process learner on a GPU. ``rl_step``
    returns None when the step ran out of device memory (the iteration failed)."""

    def rl_step(self, records: list[dict[str, Any]], advantages: list[float]) -> dict[str, float] | None: ...


class LocalTrainer:
    """The trainer of one worker in this process (no Ray, TP = DP = 1): one Learner. The GPU run uses it: the
    GPU machine has no Ray. A step that runs out of device memory returns None (the iteration failed)."""

    def __init__(self, model_dir: Path, algo: AlgoConfig, seed: int) -> None:
        self.learner = Learner(model_dir, algo=algo, reference_dir=model_dir, seed=seed)

    def profile(self, stage: str, micro_batch: int, context: int, checkpointing: bool = False) -> dict[str, float]:
        return self.learner.profile(stage, micro_batch, context, checkpointing)

    def set_layout(self, stage: str, micro_batch: int, checkpointing: bool = False) -> None:
        self.learner.set_layout(stage, micro_batch, checkpointing)

    def relayout(self, tp: int, fsdp: bool = False) -> float:
        raise ValueError(f"one in-process worker runs TP=1 unsharded only, not TP={tp}{' with FSDP' * fsdp}")

    def rl_step(self, records: list[dict[str, Any]], advantages: list[float]) -> dict[str, float] | None:
        try:
            return self.learner.measured_rl_step(records, advantages)
        except torch.OutOfMemoryError:
            self.learner.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            return None

    def close(self) -> None:
        del self.learner
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def train_through(name: str, trainer: Trainer, planner: LayoutPlanner, events: list[ev.Event],
                  iterations: Sequence[list[dict[str, Any]]], limits: Sequence[int], *, seed: int,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train on the workload once with one mode; per-iteration tokens, times, peaks and decisions."""
    log = log or (lambda line: print(line, flush=True))
    # Warm-up, untimed and the same for every mode: one step on the first iteration's games, so no mode is
    # charged for first-call costs (thread pools, allocator growth, kernel selection).
    trainer.rl_step(iterations[0], [0.0] * len(iterations[0]))
    t = time.perf_counter()
    planner.start(trainer)
    profile_s = time.perf_counter() - t if planner.auto else 0.0
    rows = []
    adv_rng = random.Random(seed)
    for it, records in enumerate(iterations):
        before = len(events)
        t0 = time.perf_counter()
        planner.before_iteration(it, records, len(iterations) - it, trainer)
        t1 = time.perf_counter()
        # Advantages: seeded +-1 per game. What is measured is the work of a step, not learning.
        adv = [adv_rng.choice((-1.0, 1.0)) for _ in records]
        metrics = trainer.rl_step(records, adv)
        lengths = [len(r["token_ids"]) for r in records]
        row: dict[str, Any] = {"iteration": it, "range": limits[it], "context_max": max(lengths),
                               "context_mean": sum(lengths) / len(lengths), "tokens": sum(lengths),
                               "decide_s": t1 - t0}
        if metrics is None:
            # Out of device memory: an over-budget event that, on a GPU, also ends the step.
            row.update(failed=True, over_budget=1, experience_s=None, train_s=None, experience_peak_gib=None,
                       train_peak_gib=None)
            after: dict[str, float] = {}
        else:
            after = planner.after_iteration(metrics, records)
            row.update(experience_s=metrics["perf/experience_s"], train_s=metrics["perf/train_s"],
                       experience_peak_gib=metrics["memory/experience_peak_bytes"] / GIB,
                       train_peak_gib=metrics["memory/train_peak_bytes"] / GIB, over_budget=0)
        new = events[before:]
        row["over_budget"] += sum(1 for e in new if isinstance(e, ev.Error))
        row.update(layouts={s: planner.current[s].key for s in ("experience", "train")},
                   switched=[e.stage for e in new if isinstance(e, ev.SelectorDecision) and e.switched],
                   selector_micro_batch={k: v for k, v in after.items() if k.endswith("_micro_batch")})
        rows.append(row)
        if metrics is None:
            log(f"  {name:>16} it {it:2d} ctx {max(lengths):5d} OUT OF MEMORY {row['layouts']['train']}")
        else:
            log(f"  {name:>16} it {it:2d} ctx {max(lengths):5d} exp {row['experience_s']:6.2f}s "
                f"train {row['train_s']:6.2f}s peak {max(row['experience_peak_gib'], row['train_peak_gib']):.2f} GiB "
                f"{row['layouts']['train']}{' OVER' if row['over_budget'] else ''}")
    logs = [e.message for e in events if isinstance(e, ev.Log)]
    return {"mode": name, "profile_s": profile_s, "iterations": rows, "logs": logs}


def summarize(run: dict[str, Any], ranges: list[int], workers: int) -> dict[str, Any]:
    """Tokens per second by context range and for the whole run. An iteration that failed (out of device
    memory) has no time: its range, and the whole run, get no throughput (None) — the run did not finish."""
    rows = run["iterations"]
    per_range = {}
    for limit in ranges:
        sel = [r for r in rows if r["range"] == limit]
        done = [r for r in sel if not r.get("failed")]
        seconds = sum(r["experience_s"] + r["train_s"] for r in done)
        complete = len(done) == len(sel) and seconds > 0
        per_range[str(limit)] = {
            "tokens_per_s": sum(r["tokens"] for r in done) / seconds if complete else None,
            "tokens_per_s_per_worker": sum(r["tokens"] for r in done) / seconds / workers if complete else None,
            "over_budget": sum(r["over_budget"] for r in sel),
            "failed": len(sel) - len(done),
            "context_max": max(r["context_max"] for r in sel),
            "context_mean": sum(r["context_mean"] for r in sel) / len(sel),
        }
    done = [r for r in rows if not r.get("failed")]
    complete = len(done) == len(rows)
    stage_s = sum(r["experience_s"] + r["train_s"] for r in done)
    switch_s = sum(r["decide_s"] for r in rows)
    total_s = stage_s + switch_s
    tokens = sum(r["tokens"] for r in rows)
    peaks = [max(r["experience_peak_gib"], r["train_peak_gib"]) for r in done]
    return {
        "per_range": per_range,
        "tokens_per_s": tokens / total_s if complete else None,
        "tokens_per_s_per_worker": tokens / total_s / workers if complete else None,
        "tokens_per_s_with_profiling": tokens / (total_s + run["profile_s"]) if complete else None,
        "over_budget": sum(r["over_budget"] for r in rows),
        "failed": len(rows) - len(done),
        "switch_s": switch_s,
        "switch_share": switch_s / total_s if total_s else 0.0,
        "profile_s": run["profile_s"],
        "max_peak_gib": max(peaks) if peaks else None,
        "switches": sum(len(r["switched"]) for r in rows),
    }


def compare(summary: dict[str, dict[str, Any]], contexts: list[int]) -> dict[str, Any]:
    """The auto mode against the static layouts: per range and whole run, and the issue's four targets."""
    statics = [n for n in summary if n != "auto"]
    auto = summary["auto"]
    ratios: dict[str, Any] = {"per_range": {}}
    for limit in map(str, contexts):
        within = [n for n in statics if summary[n]["per_range"][limit]["over_budget"] == 0
                  and summary[n]["per_range"][limit]["tokens_per_s"] is not None]
        best = max(within, key=lambda n: summary[n]["per_range"][limit]["tokens_per_s"]) if within else None
        mine = auto["per_range"][limit]["tokens_per_s"]
        ratios["per_range"][limit] = {
            "best_static_within_budget": best,
            "ratio": mine / summary[best]["per_range"][limit]["tokens_per_s"] if best and mine else None,
        }
    clean = [n for n in statics if summary[n]["over_budget"] == 0 and summary[n]["tokens_per_s"] is not None]
    best_clean = max(clean, key=lambda n: summary[n]["tokens_per_s"]) if clean else None
    finished = [n for n in statics if summary[n]["tokens_per_s"] is not None]
    best_any = max(finished, key=lambda n: summary[n]["tokens_per_s"]) if finished else None
    whole = auto["tokens_per_s"]
    ratios["whole_run_vs_best_static_within_budget"] = {
        "layout": best_clean,
        "ratio": whole / summary[best_clean]["tokens_per_s"] if best_clean and whole else None,
        "ratio_with_profiling": auto["tokens_per_s_with_profiling"] / summary[best_clean]["tokens_per_s"]
        if best_clean and whole else None}
    ratios["whole_run_vs_fastest_static_any"] = {
        "layout": best_any, "over_budget": summary[best_any]["over_budget"] if best_any else None,
        "ratio": whole / summary[best_any]["tokens_per_s"] if best_any and whole else None}
    per_range_ok = all(r["ratio"] is not None and r["ratio"] >= 0.95 for r in ratios["per_range"].values())
    whole_ratio = ratios["whole_run_vs_best_static_within_budget"]["ratio"]
    targets = {
        "per_range_ge_0.95x_best_static": per_range_ok,
        "whole_run_ge_1.15x_best_static": whole_ratio is not None and whole_ratio >= 1.15,
        "zero_over_budget_while_a_static_has_some": auto["over_budget"] == 0 and any(summary[n]["over_budget"] for n in statics),
        "switching_le_5pct": auto["switch_share"] <= 0.05,
    }
    return {"ratios": ratios, "targets": targets}


def print_table(summary: dict[str, dict[str, Any]], contexts: list[int], workers: int, budget_gib: float,
                comparison: dict[str, Any] | None) -> None:
    """The per-range table (``!`` over budget, ``oom`` failed) and, with the auto mode, the ratios and targets."""
    def cell(value: float | None, flag: str) -> str:
        return (f"{value:8.0f}" if value is not None else "     oom") + flag

    print()
    print(f"learner tokens/s of the {workers} trainer worker(s) together (divide by {workers} for per worker), "
          "by context range")
    print("mode".ljust(18) + "".join(f"{c:>9}" for c in contexts) + "    whole  over  maxGiB")
    for name, s in summary.items():
        cells = "".join(cell(s["per_range"][str(c)]["tokens_per_s"], "!" if s["per_range"][str(c)]["over_budget"] else " ")
                        for c in contexts)
        peak = f"{s['max_peak_gib']:7.2f}" if s["max_peak_gib"] is not None else "      -"
        print(f"{name:<18}{cells} {cell(s['tokens_per_s'], '')} {s['over_budget']:5d} {peak}")
    print("(! = a measured peak over the budget of %.2f GiB, or out of memory, in that range)" % budget_gib)
    if comparison is not None:
        auto = summary["auto"]
        print(json.dumps({**comparison, "auto": {k: auto[k] for k in ("switch_s", "switch_share", "profile_s", "switches")}},
                         indent=1))
