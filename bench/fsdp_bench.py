"""fsdp_bench: what FSDP2 sharding of the trainer saves in memory per worker and costs in step time.

Two trainer workers (the real Ray actors and Learner a run uses; gloo on CPU, NCCL on GPU) train the same model
on the same synthetic conversations in three layouts, one after the other, in one invocation:

- `tp1.dp2.mb2`       data parallel, every rank holds the whole model, its gradients and both Adam moments;
- `tp1.dp2.mb2+fsdp`  data parallel with FSDP2 (`fully_shard` per decoder layer): each rank stores half of them
                      and gathers one layer's parameters at a time while it runs;
- `tp2.dp1.mb2`       tensor parallel (for reference: each rank holds half of every layer, both see all the data).

The model is built locally from a config (random weights; sizes do not change with values): by default a
~62M-parameter Qwen2 (16 layers x 512, MLP 2048) so that training state, not activations, dominates a worker's
memory. KL is off (no reference copy), so what is measured is the trained model's state. Per layout: parameters
stored per rank, resident memory per worker after the steps (steady state), the step's peak (RSS sampled every
2 ms), seconds per step (experience + train), and the memory model's estimate of the state bytes per worker.

    .venv/bin/python bench/fsdp_bench.py     # --layers 16 --hidden 512 --steps 3 --sequences 8 --context 256
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from bench_io import write_result
from earl_core.agent.teacher import protocol_corpus
from earl_core.config import AlgoConfig
from earl_core.models import create_model
from earl_core.parallel.layout import Layout
from earl_core.parallel.memory import GIB, MemoryModel, ModelShape, Work
from earl_core.ray_exec.cluster import ray_cluster
from earl_core.ray_exec.groups import TrainerGroup

ROOT = Path(__file__).resolve().parent
LAYOUTS = ("tp1.dp2.mb2", "tp1.dp2.mb2+fsdp", "tp2.dp1.mb2")


def build_model(out: Path, *, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int) -> Path:
    """The protocol tokenizer (trained locally) and a freshly initialised Qwen2 of the given size, in HF format."""
    base = create_model("tiny", out / "tokenizer_source", corpus=protocol_corpus(200, seed=0), seed=0)
    config = AutoConfig.from_pretrained(base)
    config.num_hidden_layers, config.hidden_size, config.intermediate_size = layers, hidden, intermediate
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = heads, kv_heads, hidden // heads
    config.layer_types = ["full_attention"] * layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    target = out / "model"
    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (base / name).exists():
            (target / name).write_bytes((base / name).read_bytes())
    return target


def records(vocab: int, sequences: int, context: int, seed: int) -> list[dict[str, Any]]:
    """Conversations of `context` tokens; a third of the tokens are the agent's (trained on)."""
    rng = random.Random(seed)
    return [{"token_ids": [rng.randrange(3, vocab) for _ in range(context)],
             "action_mask": [0] + [1 if rng.random() < 0.33 else 0 for _ in range(context - 1)]}
            for _ in range(sequences)]


def measure(model_dir: Path, key: str, *, steps: int, sequences: int, context: int, shape: ModelShape,
            vocab: int) -> dict[str, Any]:
    layout = Layout.parse("train", key)
    micro_batch = layout.micro_batch
    algo = AlgoConfig(micro_batch=micro_batch, kl_coef=0.0, lr=1e-4)
    trainer = TrainerGroup(str(model_dir), workers=2, algo=asdict(algo), reference_dir=None, seed=0,
                           num_cpus=1, tp=layout.tp, fsdp=layout.shard == "fsdp")
    try:
        trainer.set_layout("train", micro_batch)
        trainer.set_layout("experience", micro_batch)
        batch = records(vocab, sequences, context, seed=0)
        advantages = [(-1.0) ** i for i in range(sequences)]
        trainer.rl_step(batch, advantages)  # warm-up: allocator and Adam state come to their steady size
        seconds, peaks = [], []
        for step in range(steps):
            batch = records(vocab, sequences, context, seed=step + 1)
            start = time.perf_counter()
            m = trainer.rl_step(batch, advantages)
            seconds.append(time.perf_counter() - start)
            peaks.append(max(m["memory/train_peak_bytes"], m["memory/experience_peak_bytes"]))
        resident = [r["used"] for r in trainer.memory()]
        local = trainer.local_parameters()
    finally:
        trainer.close()
    raw = MemoryModel(shape).estimate(layout, Work(sequences=micro_batch * layout.dp, context=context))
    return {"layout": key, "parameters_per_rank": local, "resident_gib_per_worker": [r / GIB for r in resident],
            "peak_gib": max(peaks) / GIB, "step_s": sorted(seconds)[len(seconds) // 2],
            "tokens_per_s": sequences * context / sorted(seconds)[len(seconds) // 2],
            "model_state_gib_per_worker": (raw.weights + raw.gradients + raw.optimizer) / GIB}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="timed steps per layout (after one warm-up step)")
    p.add_argument("--sequences", type=int, default=8, help="conversations per step")
    p.add_argument("--context", type=int, default=256, help="tokens per conversation")
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--out", default=str(ROOT / "results" / "fsdp_bench.json"))
    args = p.parse_args(argv)
    keys = [k.strip() for k in args.layouts.split(",") if k.strip()]
    for k in keys:
        if Layout.parse("train", k).workers != 2:  # a bad key stops here, with the allowed forms
            p.error(f"--layouts: {k} is not a layout of 2 trainer workers (tp x dp = 2)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ray_cluster(num_cpus=2):
        model_dir = build_model(Path(tmp), layers=args.layers, hidden=args.hidden, intermediate=args.intermediate,
                                heads=args.heads, kv_heads=args.kv_heads)
        hf = AutoConfig.from_pretrained(model_dir)
        shape = ModelShape.from_hf_config(hf.to_dict())
        params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
        print(f"model: {params / 1e6:.1f}M parameters, {args.layers} layers x {args.hidden}", flush=True)
        for key in keys:
            row = measure(model_dir, key, steps=args.steps, sequences=args.sequences, context=args.context,
                          shape=shape, vocab=int(hf.vocab_size))
            rows.append(row)
            print(f"{key:14s} params/rank {max(row['parameters_per_rank']) / 1e6:6.1f}M  resident "
                  f"{max(row['resident_gib_per_worker']):.2f} GiB  peak {row['peak_gib']:.2f} GiB  "
                  f"step {row['step_s']:.2f} s  ({row['tokens_per_s']:.0f} tok/s)  "
                  f"model state {row['model_state_gib_per_worker']:.2f} GiB", flush=True)
    by = {r["layout"]: r for r in rows}
    ratios = {}
    if "tp1.dp2.mb2" in by and "tp1.dp2.mb2+fsdp" in by:
        dp, fsdp = by["tp1.dp2.mb2"], by["tp1.dp2.mb2+fsdp"]
        ratios = {"fsdp_vs_dp_resident": max(fsdp["resident_gib_per_worker"]) / max(dp["resident_gib_per_worker"]),
                  "fsdp_vs_dp_peak": fsdp["peak_gib"] / dp["peak_gib"],
                  "fsdp_vs_dp_step_time": fsdp["step_s"] / dp["step_s"]}
        print(" ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    result = {"bench": "fsdp_bench", "args": vars(args), "parameters": params, "layouts": rows, "ratios": ratios,
              "machine": {"cpus": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__,
                          "cuda": torch.cuda.is_available()}}
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
