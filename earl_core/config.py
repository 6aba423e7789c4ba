"""Run configuration: frozen dataclasses validated on construction (the one place validation lives)."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from earl_core.errors import ConfigError
from earl_core.rl.schedule import LR_SCHEDULES

SFT_BATCHINGS = ("by_length", "shuffled")  # how the warm start cuts its batches (earl_core.rl.batch.sft_batches)

CONFIG_VERSION = 1
MAX_POSITIONS = 16384  # max_position_embeddings of the built-in model presets
FLOAT_MAX_BITS = 1024  # ints above 2**1024 overflow a float
_OPPONENT_RE = re.compile(r"^(random|heuristic(:(100|[1-9]?[0-9]))?|solver(:([1-9]|[1-3][0-9]|4[0-2]))?)$")
# How the agent protocol writes the board (and, for cells_checks, the answer): earl_core.agent.protocol.
BOARD_FORMATS = ("rows", "cells", "cells_landing", "cells_checks", "cells_stack", "cells_stack_checks")
# The formats whose answers open with a check of every legal column (protocol.check_text).
CHECK_FORMATS = ("cells_checks", "cells_stack_checks")
# Whose stones are which letter on the board the agent reads: X and O as they are, or the agent's always X.
BOARD_VIEWS = ("absolute", "relative")
# An answer that checks all 7 columns takes up to ~20 tokens with a tokenizer built for the protocol
# (tests/core/test_teacher.py); the rest is room for a model's own words before its [col N].
CHECKS_NEW_TOKENS = 32
# The presets a run may train on CPU (earl_core.models.MODEL_PRESETS holds them and the GPU-only shapes).
TRAINABLE_PRESETS = ("tiny", "tiny-deep", "small")
POSITION_SOURCES = ("games", "mixed")  # where sft.positions are cut from (earl_core.agent.teacher)
OPPONENT_ALLOWED = ("random, heuristic, heuristic:P (P% random moves, 0..100), solver, solver:D with D in 1..42, "
                    "or a comma-separated list of these")


def opponent_list(value: object, field_name: str) -> list[str]:
    """Split a comma-separated opponent list, checking every entry."""
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else []
    if not names or not all(_OPPONENT_RE.match(n) for n in names):
        raise ConfigError(field_name, f"unknown opponent {value!r}", allowed=OPPONENT_ALLOWED)
    return names


def _check_range(name: str, value: float, lo: float | None, hi: float | None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, f"must be a number, got {value!r}", allowed=_range_text(lo, hi))
    # NaN compares False with everything, so it must be refused explicitly.
    if not math.isfinite(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(name, f"{value!r} is out of range", allowed=_range_text(lo, hi))


def _range_text(lo: float | None, hi: float | None) -> str:
    if lo is None:
        return f"<= {hi}"
    if hi is None:
        return f">= {lo}"
    return f"{lo}..{hi}"


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(name, f"unknown value {value!r}", allowed=choices)


@dataclass(frozen=True)
class ModelConfig:
    """Which policy to train."""

    path: str | None = None
    """Local Hugging Face model directory or hub id; None builds a fresh model from `preset`."""
    preset: str = "tiny"
    """Architecture preset used when `path` is None (see earl_core.models.MODEL_PRESETS)."""
    vocab_size: int = 512
    """Tokenizer size for a freshly built model."""

    def __post_init__(self) -> None:
        _check_choice("model.preset", self.preset, TRAINABLE_PRESETS)
        _check_range("model.vocab_size", self.vocab_size, 300, 65536)
        if self.path is not None and (not isinstance(self.path, str) or not self.path.strip()):
            raise ConfigError("model.path", "must be a non-empty string or null", allowed="a local directory or hub id")


@dataclass(frozen=True)
class GameConfig:
    """Connect Four episodes: who the agent plays and how strict the protocol is."""

    opponent: str = "random"
    """Opponent policy: random, heuristic, solver or solver:D (depth-limited); a comma-separated list
    (e.g. "random,heuristic") assigns them to game groups in turn."""
    agent_side: str = "both"
    """Which side the agent plays: first, second, or both (half the games each)."""
    max_invalid: int = 1
    """Invalid answers tolerated per turn: each gets feedback and a retry; one more loses the game."""
    format_penalty: float = 0.0
    """Reward subtracted per invalid answer (on top of win +1 / loss -1 / draw 0)."""
    board_format: str = "rows"
    """How each turn writes the board: rows (a column header, then rows of X / O / .), cells (one word per
    cell, e.g. `dax` = column d (3), bottom row a, X; a freshly built tokenizer makes each one token, which small
    models learn tactics from far sooner), cells_landing (cells, and each legal column followed by the word of the
    empty cell its stone would land in, e.g. `3 dbe`), cells_checks (cells_landing, and the agent is asked to go
    through the legal columns before its move, marking each landing cell win, block or gift: `aae cbe block dce
    [col 2]`; the teacher's answers do so, and rollout.max_new_tokens must be at least 32), cells_stack (cells_landing,
    and each landing cell followed by the like stones right under it, at most three, e.g. `3 dde oo`) or
    cells_stack_checks (cells_stack with the answers of cells_checks). A checkpoint records it; eval and play use
    the checkpoint's."""
    board_view: str = "absolute"
    """Which letter stands for whose stones on the board the agent reads: absolute (X for the first player, O for
    the second, as the system prompt says) or relative (the agent's own stones are always X and its opponent's O,
    whichever side it plays, so a position and its colour swap read the same and "my four" is one pattern, not
    one per side). A checkpoint records it; eval and play use the checkpoint's."""

    def __post_init__(self) -> None:
        opponent_list(self.opponent, "game.opponent")
        _check_choice("game.agent_side", self.agent_side, ("first", "second", "both"))
        _check_range("game.max_invalid", self.max_invalid, 0, 10)
        _check_range("game.format_penalty", self.format_penalty, 0.0, 1.0)
        _check_choice("game.board_format", self.board_format, BOARD_FORMATS)
        _check_choice("game.board_view", self.board_view, BOARD_VIEWS)


@dataclass(frozen=True)
class RolloutConfig:
    """Rollout stage: engine, sampling and batch size."""

    engine: str = "vllm"
    """Rollout engine: vllm (default, prefix caching) or hf (transformers reference)."""
    workers: int = 1
    """Rollout ranks (one CPU, or GPU, each): workers / parallelism.rollout_tp engines (Ray actors) of
    rollout_tp ranks each; games are split between the engines."""
    groups: int = 8
    """Game groups per iteration; games in a group share an opening and are compared by GRPO."""
    group_size: int = 8
    """Games per group."""
    temperature: float = 1.0
    """Sampling temperature during training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 16
    """Tokens the agent may write per turn."""
    max_context: int = 4096
    """Longest conversation (tokens) an episode may reach; longer games end as a loss for the agent."""
    kv_cache_gib: float = 1.0
    """vLLM KV cache size on CPU (GiB)."""

    def __post_init__(self) -> None:
        _check_choice("rollout.engine", self.engine, ("vllm", "hf"))
        _check_range("rollout.workers", self.workers, 1, 256)
        _check_range("rollout.groups", self.groups, 1, 4096)
        _check_range("rollout.group_size", self.group_size, 1, 256)
        _check_range("rollout.temperature", self.temperature, 0.0, 2.0)
        if 0 < self.temperature < 0.01:
            raise ConfigError("rollout.temperature", f"{self.temperature!r} is out of range", allowed="0 (greedy) or 0.01..2.0")
        _check_range("rollout.top_p", self.top_p, 0.01, 1.0)
        _check_range("rollout.max_new_tokens", self.max_new_tokens, 1, 4096)
        _check_range("rollout.max_context", self.max_context, 256, 131072)
        _check_range("rollout.kv_cache_gib", self.kv_cache_gib, 0.05, 1024)
        if self.max_new_tokens * 4 > self.max_context:
            raise ConfigError("rollout.max_new_tokens", f"{self.max_new_tokens} leaves no room for a game in "
                              f"rollout.max_context={self.max_context}", allowed=f"1..{self.max_context // 4}")


@dataclass(frozen=True)
class AlgoConfig:
    """Policy optimisation: advantage estimator, clipping, KL and optimiser."""

    name: str = "grpo"
    """grpo (group-relative advantages) or reinforce (REINFORCE with a running-mean baseline)."""
    lr: float = 3e-4
    """AdamW learning rate."""
    clip_eps: float = 0.2
    """PPO clipping range of the probability ratio."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy, the one RL starts from (the warm-started one where
    sft.enabled); 0 turns the reference model off."""
    epochs: int = 1
    """Optimisation passes over each iteration's games."""
    mini_batches: int = 1
    """Optimiser steps per epoch (PPO's minibatches): each epoch deals the iteration's games at random into this
    many parts and takes a step on each, so the same rollouts give more updates; the ratio clipping keeps every
    step near the policy that played the games. 1 (default): one step on all of them."""
    micro_batch: int = 16
    """Sequences per forward/backward pass (gradients accumulate over micro-batches)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    normalize_std: bool = True
    """GRPO: divide by the group's reward std (Dr. GRPO style when false)."""
    baseline_decay: float = 0.9
    """REINFORCE: decay of the running-mean reward baseline."""
    turn_discount: float = 1.0
    """Credit of each answer in its game's outcome: the k-th answer from the end weighs turn_discount**k in the
    loss (a retry after an invalid answer counts as an answer). 1 (default): every answer shares the outcome
    equally; below 1 the last answers, which decide most games against weak opponents, take most of it."""

    def __post_init__(self) -> None:
        _check_choice("algo.name", self.name, ("grpo", "reinforce"))
        _check_range("algo.lr", self.lr, 1e-8, 1.0)
        _check_range("algo.clip_eps", self.clip_eps, 0.0, 1.0)
        _check_range("algo.kl_coef", self.kl_coef, 0.0, 10.0)
        _check_range("algo.epochs", self.epochs, 1, 100)
        _check_range("algo.mini_batches", self.mini_batches, 1, 4096)
        _check_range("algo.micro_batch", self.micro_batch, 1, 4096)
        _check_range("algo.max_grad_norm", self.max_grad_norm, 0.0, 1e6)
        _check_range("algo.baseline_decay", self.baseline_decay, 0.0, 1.0)
        _check_range("algo.turn_discount", self.turn_discount, 0.0, 1.0)
        if not isinstance(self.normalize_std, bool):
            raise ConfigError("algo.normalize_std", f"must be true or false, got {self.normalize_std!r}", allowed="true, false")


@dataclass(frozen=True)
class SFTConfig:
    """Optional supervised warm start on games of a teacher opponent."""

    enabled: bool = False
    """Run the warm start before RL."""
    teacher: str = "heuristic"
    """Teacher policy whose moves are imitated: heuristic, solver or solver:D."""
    opponents: str = "random,heuristic"
    """Who the teacher plays in the warm-start games (comma-separated list, used in turn), so the
    imitated positions cover both weak and sensible opposition."""
    games: int = 2000
    """Teacher games to imitate."""
    positions: int = 0
    """Single turns added to the warm start (the opponent's move, the board, the teacher's answer), 70% of them
    turns where a column wins for either side. A turn is ~10x shorter than a game, so they give many more
    optimiser steps per minute on the tactics (batches hold games or positions, never both: a batch is padded to
    its longest conversation)."""
    position_source: str = "games"
    """Where the positions come from: games (the agent turns of the teacher games above) or mixed (every turn of
    positions/8 fresh games in which each move is random at even odds and the teacher's otherwise, labelled with
    the teacher's move: about 20x more distinct win and block positions than 1,500 teacher games hold)."""
    positions_per_conversation: int = 1
    """Positions packed into one conversation (one system prompt, then position after position as the turns of a
    game): the system prompt is paid once, so about twice the positions per minute at 8."""
    epochs: int = 2
    """Passes over the teacher games (and the positions)."""
    lr: float = 1e-3
    """Learning rate of the warm start."""
    lr_schedule: str = "constant"
    """How the warm start's learning rate changes over its steps (all epochs): constant, or cosine (from lr at the
    first step down along half a cosine, to near zero at the last)."""
    batch: int = 32
    """Conversations per optimiser step."""
    batching: str = "by_length"
    """How conversations meet in a batch: by_length (shuffled, then sorted by length within pools of 50 batches:
    a batch is padded to its longest conversation, and the teacher games' steps cost about 2x less this way) or
    shuffled (any lengths together: the batching of every run before it, to reproduce them)."""
    mistake_rate: float = 0.0
    """Share of teacher turns and positions (with a full column on the board) that first name a full column
    (the one the previous answer named where it is full now, else the most central), get the feedback and then
    answer well: teaches recovering from an invalid answer. The wrong answers stay in the context but are never
    learning targets."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError("sft.enabled", f"must be true or false, got {self.enabled!r}", allowed="true, false")
        if not isinstance(self.teacher, str) or not _OPPONENT_RE.match(self.teacher) or self.teacher == "random":
            raise ConfigError("sft.teacher", f"unknown teacher {self.teacher!r}", allowed="heuristic, solver, solver:D with D in 1..42")
        opponent_list(self.opponents, "sft.opponents")
        _check_range("sft.games", self.games, 1, 10_000_000)
        _check_range("sft.positions", self.positions, 0, 10_000_000)
        _check_choice("sft.position_source", self.position_source, POSITION_SOURCES)
        _check_range("sft.positions_per_conversation", self.positions_per_conversation, 1, 64)
        _check_range("sft.epochs", self.epochs, 1, 1000)
        _check_range("sft.lr", self.lr, 1e-8, 1.0)
        _check_choice("sft.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _check_range("sft.batch", self.batch, 1, 4096)
        _check_choice("sft.batching", self.batching, SFT_BATCHINGS)
        _check_range("sft.mistake_rate", self.mistake_rate, 0.0, 1.0)


def _int_list(name: str, value: Any, lo: int, hi: int) -> list[int]:
    """A comma-separated list of whole numbers in lo..hi (what list-valued fields are written as)."""
    allowed = f"comma-separated whole numbers in {lo}..{hi}, e.g. 1,2,4"
    parts = [v.strip() for v in value.split(",")] if isinstance(value, str) else []
    if not parts or not all(p.isascii() and p.isdigit() and lo <= int(p) <= hi for p in parts):
        raise ConfigError(name, f"cannot read {value!r}", allowed=allowed)
    return sorted({int(p) for p in parts})


@dataclass(frozen=True)
class ParallelismConfig:
    """Parallel layouts of the experience and train stages: fixed, or re-picked by the Parallelism Selector."""

    mode: str = "static"
    """static: algo.micro_batch for every stage, no profiling; auto: profile the candidate layouts at start-up,
    then before each iteration keep or switch each stage's layout for the context lengths being seen."""
    memory_budget_gib: float = 0.0
    """Memory budget per trainer worker in GiB (0 = none). No layout predicted over it is chosen; a measured
    peak over it is an error event."""
    micro_batches: str = "1,2,4,8,16"
    """Candidate micro-batch sizes (sequences per forward pass)."""
    profile_contexts: str = "256,1024,4096"
    """Context lengths (tokens) each candidate is profiled at in auto mode; others are predicted from a fit."""
    hysteresis: float = 0.05
    """A running layout is only left for one predicted at least this much faster (relative)."""
    horizon: int = 5
    """Coming iterations over which a switch must pay back its cost."""
    train_tp: int = 1
    """Tensor-parallel degree of the trainer (experience and train stages): trainer_workers / train_tp
    data-parallel groups of train_tp ranks, each holding a slice of every layer. Must divide trainer_workers and
    the model's attention heads, KV heads and MLP width."""
    rollout_tp: int = 1
    """Tensor-parallel degree of each rollout engine (vLLM tensor_parallel_size): rollout.workers / rollout_tp
    engines. Static mode runs it throughout; auto mode profiles every degree the rollout workers and the model's
    heads allow and re-picks it as context grows (an engine rebuild, charged at its measured cost). Must divide
    rollout.workers; 1 with rollout.engine=hf."""
    checkpointing: bool = False
    """Static mode: activation checkpointing in the train stage (less memory, one more forward pass). Auto
    mode profiles both and chooses."""
    train_fsdp: bool = False
    """Shard the trained model's parameters, gradients and optimizer state over the trainer's data-parallel
    ranks with FSDP2 (each rank stores 1/DP of them, DP = trainer_workers / TP; parameters are gathered layer by
    layer as they are used). With TP > 1 this is 2-D: the layers' projections are split by TP and sharded by
    FSDP, so a rank stores 1/(TP x DP) of them. Needs at least 2 data-parallel ranks. Static mode: runs sharded
    throughout at train_tp. Auto mode: the FSDP layouts of every TP degree that leaves 2 or more DP ranks become
    candidates too, profiled beside the others; the selector shards the trainer when that is the fastest layout
    that fits the memory budget (a switch in or out moves the training state in memory, charged at its measured
    cost)."""

    def __post_init__(self) -> None:
        _check_choice("parallelism.mode", self.mode, ("static", "auto"))
        _check_range("parallelism.memory_budget_gib", self.memory_budget_gib, 0.0, 1e6)
        _int_list("parallelism.micro_batches", self.micro_batches, 1, 4096)
        _int_list("parallelism.profile_contexts", self.profile_contexts, 16, 1 << 20)
        _check_range("parallelism.hysteresis", self.hysteresis, 0.0, 10.0)
        _check_range("parallelism.horizon", self.horizon, 1, 1_000_000)
        _check_range("parallelism.train_tp", self.train_tp, 1, 1024)
        _check_range("parallelism.rollout_tp", self.rollout_tp, 1, 256)
        if not isinstance(self.checkpointing, bool):
            raise ConfigError("parallelism.checkpointing", f"must be true or false, got {self.checkpointing!r}",
                              allowed="true, false")
        if not isinstance(self.train_fsdp, bool):
            raise ConfigError("parallelism.train_fsdp", f"must be true or false, got {self.train_fsdp!r}",
                              allowed="true, false")

    @property
    def micro_batch_list(self) -> list[int]:
        return _int_list("parallelism.micro_batches", self.micro_batches, 1, 4096)

    @property
    def context_list(self) -> list[int]:
        return _int_list("parallelism.profile_contexts", self.profile_contexts, 16, 1 << 20)

    @property
    def budget_bytes(self) -> int | None:
        return int(self.memory_budget_gib * (1 << 30)) if self.memory_budget_gib > 0 else None


@dataclass(frozen=True)
class DispatchConfig:
    """How played games reach the trainer ranks (the Data Dispatcher)."""

    mode: str = "layout_aware"
    """layout_aware: each rollout engine sends its games' token tensors straight to the trainer ranks that need
    them (one copy per node, balanced by tokens, same-node first) and advantages are computed on the ranks from
    per-group reward scalars, so no bulk byte passes through the driver; centralized: the driver gathers every
    game, computes the advantages, re-splits and sends (what single-controller frameworks do; the baseline)."""
    transport: str = "collective"
    """How layout_aware moves the bytes: collective (torch.distributed point-to-point messages over a gloo group of
    the engines and the trainer ranks; nearest the link limit in bench/dispatch_bench.py) or object_store (Ray
    object references handed worker to worker). The centralized mode always goes through the driver's store."""

    def __post_init__(self) -> None:
        _check_choice("dispatch.mode", self.mode, ("layout_aware", "centralized"))
        _check_choice("dispatch.transport", self.transport, ("collective", "object_store"))


@dataclass(frozen=True)
class RunConfig:
    """A whole training run."""

    name: str = "earl-run"
    """Human name of the run (used for the output folder)."""
    seed: int = 0
    """Seed of every random source (model init, games, sampling)."""
    iterations: int = 20
    """RL iterations (rollout -> experience -> train -> weight sync)."""
    trainer_workers: int = 1
    """Data-parallel trainer workers (Ray actors, gradients all-reduced with gloo/NCCL)."""
    trainer_cpus: int = 1
    """CPU threads per trainer worker (Ray CPUs it reserves; rollout and training alternate, so on one
    machine the trainer may use the cores the rollout workers leave idle)."""
    checkpoint_every: int = 10
    """Save a checkpoint every N iterations (and always at the end)."""
    eval_games: int = 0
    """Greedy games against the opponent after training (0 = skip)."""
    max_worker_restarts: int = 2
    """Times the run rebuilds its worker groups after a rollout or trainer worker dies (killed, out of memory, its
    node lost): it continues from its last checkpoint, training the iterations since then again; one more death
    fails the run."""
    output_dir: str = "runs"
    """Parent folder of the run's folder (metrics.jsonl, checkpoints/)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    game: GameConfig = field(default_factory=GameConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$", self.name):
            raise ConfigError("name", f"invalid run name {self.name!r}", allowed="1-100 letters, digits, '_', '.', '-'")
        _check_range("seed", self.seed, 0, 2**31 - 1)
        _check_range("iterations", self.iterations, 0, 1_000_000)
        _check_range("trainer_workers", self.trainer_workers, 1, 1024)
        _check_range("trainer_cpus", self.trainer_cpus, 1, 256)
        _check_range("checkpoint_every", self.checkpoint_every, 1, 1_000_000)
        _check_range("eval_games", self.eval_games, 0, 1_000_000)
        _check_range("max_worker_restarts", self.max_worker_restarts, 0, 100)
        if self.trainer_workers % self.parallelism.train_tp:
            raise ConfigError("parallelism.train_tp", f"{self.parallelism.train_tp} does not divide trainer_workers="
                              f"{self.trainer_workers}",
                              allowed=[d for d in range(1, self.trainer_workers + 1) if self.trainer_workers % d == 0])
        if self.parallelism.train_fsdp and self.trainer_workers < 2:
            raise ConfigError("parallelism.train_fsdp", "FSDP shards over data-parallel ranks: one trainer worker has "
                              "nothing to shard over", allowed="false, or trainer_workers >= 2")
        p = self.parallelism
        if p.train_fsdp and p.mode == "static" and self.trainer_workers // p.train_tp < 2:
            raise ConfigError("parallelism.train_fsdp", f"FSDP shards over the data-parallel ranks, and "
                              f"trainer_workers={self.trainer_workers} at train_tp={p.train_tp} leaves one",
                              allowed=f"false, or train_tp <= {self.trainer_workers // 2} (at least 2 data-parallel "
                                      "ranks), or parallelism.mode=auto")
        if self.rollout.workers % self.parallelism.rollout_tp:
            raise ConfigError("parallelism.rollout_tp", f"{self.parallelism.rollout_tp} does not divide rollout.workers="
                              f"{self.rollout.workers}",
                              allowed=[d for d in range(1, self.rollout.workers + 1) if self.rollout.workers % d == 0])
        if self.rollout.engine == "hf" and self.parallelism.rollout_tp != 1:
            raise ConfigError("parallelism.rollout_tp", "the hf engine has no tensor parallelism", allowed=[1])
        if self.games_per_iteration < self.trainer_workers:
            raise ConfigError("trainer_workers", f"{self.trainer_workers} ranks but only {self.games_per_iteration} games "
                              "per iteration", allowed=f"1..{self.games_per_iteration} (rollout.groups x rollout.group_size)")
        per_rank = self.games_per_iteration // self.trainer_workers
        if self.algo.mini_batches > per_rank:
            raise ConfigError("algo.mini_batches", f"{self.algo.mini_batches} mini-batches but {per_rank} games per trainer "
                              "rank an iteration", allowed=f"1..{per_rank} (rollout.groups x rollout.group_size / "
                                                           "trainer_workers)")
        if not isinstance(self.output_dir, str) or not self.output_dir:
            raise ConfigError("output_dir", "must be a non-empty path", allowed="a folder path")
        if self.sft.enabled and self.sft.batch < self.trainer_workers:
            raise ConfigError("sft.batch", f"{self.sft.batch} games per step cannot feed {self.trainer_workers} trainer "
                              "ranks", allowed=f"{self.trainer_workers}..4096")
        if self.algo.name == "grpo" and self.rollout.temperature == 0 and self.rollout.group_size > 1:
            raise ConfigError("rollout.temperature", "0 (greedy) makes every game of a GRPO group identical, so no "
                              "advantage is ever non-zero", allowed="0.01..2.0 with algo.name=grpo")
        if self.game.board_format in CHECK_FORMATS and self.rollout.max_new_tokens < CHECKS_NEW_TOKENS:
            raise ConfigError("rollout.max_new_tokens", f"{self.rollout.max_new_tokens} cannot hold an answer that "
                              "checks every legal column first "
                              f"(game.board_format={self.game.board_format})",
                              allowed=f"{CHECKS_NEW_TOKENS}..4096 with {self.game.board_format}")
        if self.model.path is None and self.rollout.max_context > MAX_POSITIONS:
            raise ConfigError("rollout.max_context", f"{self.rollout.max_context} exceeds the built-in presets' "
                              f"{MAX_POSITIONS} positions", allowed=f"256..{MAX_POSITIONS}")

    @property
    def games_per_iteration(self) -> int:
        return self.rollout.groups * self.rollout.group_size

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (YAML/JSON ready), including the config version."""
        return {"version": CONFIG_VERSION, **dataclasses.asdict(self)}

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Any) -> RunConfig:
        """Build from a plain mapping; unknown keys and wrong types raise ConfigError naming the field."""
        if not isinstance(data, dict):
            raise ConfigError("config", f"must be a mapping, got {type(data).__name__}", allowed="a YAML/JSON object")
        data = dict(data)
        version = data.pop("version", CONFIG_VERSION)
        if version != CONFIG_VERSION:
            raise ConfigError("version", f"unsupported config version {version!r}", allowed=[CONFIG_VERSION])
        return _build(cls, data, prefix="")


def _build(cls: type, data: dict[str, Any], *, prefix: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    # YAML keys may be numbers or null: they are named as text; an empty key as "" so the field is never blank.
    unknown = sorted({str(k) or '""' for k in data} - known)
    if unknown:
        raise ConfigError(prefix + unknown[0], "unknown field", allowed=sorted(known))
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        path = prefix + name
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(path, f"must be a mapping, got {value!r}", allowed=sorted(f.name for f in dataclasses.fields(hint)))
            kwargs[name] = _build(hint, value, prefix=path + ".")
        else:
            kwargs[name] = _coerce(path, hint, value)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as exc:  # a wrong type reached a comparison inside validation
        raise ConfigError(prefix.rstrip(".") or "config", str(exc)) from exc


def _coerce(path: str, hint: Any, value: Any) -> Any:
    """Accept ints where floats are expected (YAML writes 1 for 1.0); reject other type mismatches clearly."""
    if isinstance(value, int) and value.bit_length() > FLOAT_MAX_BITS:
        # Such an int cannot become a float, and past 4300 digits Python will not even print it in a message.
        raise ConfigError(path, f"an integer of {value.bit_length()} bits is too large", allowed="a number below 1.8e308")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(path, f"must be an integer, got {value!r}", allowed="an integer")
    if hint is str and not isinstance(value, str):
        raise ConfigError(path, f"must be a string, got {value!r}", allowed="a string")
    return value


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config file and apply `key.sub=value` overrides (values parsed as YAML)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError("config", f"file not found: {p}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("config", f"cannot read {p}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{p} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError("config", f"{p} must hold a mapping, got {type(data).__name__}", allowed="a YAML mapping")
    return RunConfig.from_dict(apply_overrides(data, overrides or []))


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b.c=value` applied."""
    out = _deep_copy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", f"expected key=value, got {item!r}", allowed="dotted.key=value")
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(key, "is not a section", allowed="dotted path of a config field")
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(key.strip(), f"value {raw!r} is not valid YAML", allowed="a YAML scalar") from exc
    return out


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def config_errors(data: Any, *, limit: int = 50) -> list[ConfigError]:
    """Every bad field of ``data``, not only the first: what an API answers so a user can fix all at once.

    Each error found is recorded, the offending key is dropped (its default takes over), and validation runs again.
    """
    if not isinstance(data, dict):
        try:
            RunConfig.from_dict(data)
        except ConfigError as exc:
            return [exc]
    work = _deep_copy(data)
    errors: list[ConfigError] = []
    seen: set[str] = set()
    while len(errors) < limit:
        try:
            RunConfig.from_dict(work)
            return errors
        except ConfigError as exc:
            if exc.field not in seen:
                errors.append(exc)
            if exc.field in seen or not _drop_path(work, exc.field):
                return errors  # nothing left to drop (a rule on defaults): what was found is the answer
            seen.add(exc.field)
    return errors


def _drop_path(data: dict[str, Any], dotted: str) -> bool:
    """Remove ``a.b.c`` from nested dicts; False when the path is absent."""
    *parents, leaf = dotted.split(".")
    node: Any = data
    for key in parents:
        if not isinstance(node, dict) or not isinstance(node.get(key), dict):
            return False
        node = node[key]
    if isinstance(node, dict) and leaf in node:
        del node[leaf]
        return True
    return False
