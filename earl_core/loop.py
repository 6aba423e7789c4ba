"""The training loop, top to bottom: rollout -> experience -> train -> weight sync, reported as events."""

from __future__ import annotations

import json
import math
import random
import shutil
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray
import yaml
from transformers import AutoConfig, AutoTokenizer

from earl_core import events as ev
from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.runner import GameSpec, RunnerLimits, play_episodes
from earl_core.agent.teacher import (MIXED_POSITIONS_PER_GAME, game_turns, mixed_play_turns, one_turn_positions,
                                     protocol_corpus, teacher_policy)
from earl_core.checkpoints import STATE_FILE, complete_checkpoints
from earl_core.config import RunConfig, opponent_list
from earl_core.env.connect_four import Board
from earl_core.env.opponents import make_opponent
from earl_core.errors import ConfigError, WorkerLostError
from earl_core.evaluate import run_limits
from earl_core.games import iteration_specs, rollout_metrics
from earl_core.models import create_model
from earl_core.parallel.layout import tp_degrees
from earl_core.parallel.memory import ModelShape
from earl_core.parallel.planner import LayoutPlanner
from earl_core.parallel.rollout_planner import RolloutPlanner
from earl_core.parallel.tensor_parallel import check_tp_degree
from earl_core.ray_exec.cluster import ray_cluster
from earl_core.ray_exec.dispatcher import Dispatcher, DispatchReport
from earl_core.ray_exec.groups import WORKER_LOST, RolloutGroup, TrainerGroup
from earl_core.rl.advantages import RunningBaseline
from earl_core.rl.batch import sft_batches
from earl_core.rl.schedule import scheduled_lr

# Progress lines per warm-start epoch: an epoch is one metrics point but can take many minutes.
SFT_PROGRESS_LINES = 10


@dataclass
class RunSummary:
    """What a finished (or stopped) run reports back."""

    status: str
    iterations_done: int
    last_checkpoint: str | None
    final_metrics: dict[str, float]
    run_dir: str


def base_model_dir(cfg: RunConfig) -> str:
    """The starting policy: the configured path/hub id, or a fresh model built once into the run folder."""
    if cfg.model.path:
        return cfg.model.path
    target = cfg.run_dir / "base_model"
    if not (target / "config.json").exists():
        shutil.rmtree(target, ignore_errors=True)
        corpus = protocol_corpus(400, seed=cfg.seed, board_format=cfg.game.board_format,
                                 board_view=cfg.game.board_view)
        create_model(cfg.model.preset, target, corpus=corpus, seed=cfg.seed,
                     vocab_size=cfg.model.vocab_size)
    return str(target)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest iteration number (half-written ones end in .tmp)."""
    ckpts = complete_checkpoints(run_dir)
    return ckpts[-1][1] if ckpts else None


def _last_seq(events_path: Path) -> int:
    """Highest seq already written, so a resumed run keeps numbering without a gap or a repeat."""
    if not events_path.exists():
        return 0
    last = 0
    for line in events_path.read_text().splitlines():
        try:
            last = max(last, int(json.loads(line)["seq"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash
    return last


def _truncate_metrics(path: Path, before: int) -> None:
    """Drop metric lines of iterations that will be replayed after a resume."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["iteration"] < before]
        path.write_text("".join(line + "\n" for line in keep))


def train(
    cfg: RunConfig,
    sink: ev.EventSink | None = None,
    *,
    run_id: int | str | None = None,
    resume: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
    ray_address: str | None = None,
    start_seq: int | None = None,
    should_pause: Callable[[], bool] = lambda: False,
) -> RunSummary:
    """Run the whole training; every status, metric, memory reading and sample game goes to `sink`.

    Between iterations, `should_stop` ends the run as cancelled and `should_pause` as paused (a scheduler taking
    the resources back); either way a checkpoint of the next iteration is written first, so `resume=True` later
    continues from exactly there.

    `start_seq` is the last event number the caller already holds (None: continue the run folder's
    events.jsonl when resuming, else start at 1).
    """
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    events_path = run_dir / "events.jsonl"
    if start_seq is None:
        start_seq = _last_seq(events_path) if resume else 0
        if not resume:
            events_path.unlink(missing_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    file_sink = ev.jsonl_sink(events_path)

    def both(envelope: dict[str, Any]) -> None:
        file_sink(envelope)
        if sink is not None:
            sink(envelope)

    stream = ev.EventStream(run_id if run_id is not None else cfg.name, both, start_seq=start_seq)
    stream.emit(ev.RunStatus("starting", "preparing model and workers"))
    restarts = 0
    try:
        while True:
            try:
                return _run(cfg, stream, resume=resume or restarts > 0, should_stop=should_stop,
                            should_pause=should_pause, ray_address=ray_address)
            except WORKER_LOST as exc:
                if restarts >= cfg.max_worker_restarts:
                    raise WorkerLostError(f"a worker died and the run already rebuilt its workers {restarts} "
                                          f"times (max_worker_restarts={cfg.max_worker_restarts}): {exc}") from exc
                restarts += 1
                # The groups are closed (the dead worker's peers killed); all start again from the checkpoint.
                ckpt = complete_checkpoints(run_dir)
                where = f"the checkpoint at iteration {ckpt[-1][0]}" if ckpt else "the start (no checkpoint yet)"
                stream.emit(ev.Log("warning", f"worker lost: {type(exc).__name__}: {str(exc)[:2000]}"))
                stream.emit(ev.RunStatus("starting", f"a worker died; rebuilding the worker groups from {where} "
                                                     f"(restart {restarts} of at most {cfg.max_worker_restarts})"))
    except BaseException as exc:
        stream.emit(ev.Error(message=str(exc) or type(exc).__name__, kind=type(exc).__name__,
                             traceback=traceback.format_exc()))
        stream.emit(ev.RunStatus("failed", str(exc)))
        raise


def _reference_dir(cfg: RunConfig, base: str, *, resumed: bool) -> str:
    """Where the KL reference is loaded from: the fresh model, or on a resume of a warm-started run its checkpoint
    0 (a fresh run copies the policy into the reference after its warm start: `_warm_start`)."""
    zero = dict(complete_checkpoints(cfg.run_dir)).get(0) if resumed else None
    return str(zero) if zero is not None else base


def _gpus_per_worker(cfg: RunConfig) -> float:
    """A whole GPU per worker where there are enough, else an equal share (vLLM then takes a share of memory)."""
    total = ray.cluster_resources().get("GPU", 0)
    if total <= 0:
        return 0.0
    return min(1.0, total / (cfg.rollout.workers + cfg.trainer_workers))


def _run(cfg: RunConfig, stream: ev.EventStream, *, resume: bool, should_stop: Callable[[], bool],
         should_pause: Callable[[], bool], ray_address: str | None) -> RunSummary:
    run_dir = cfg.run_dir
    base = base_model_dir(cfg)
    start_iter, init_dir, baseline_value = 0, base, None
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if checkpoint is not None:
        state = json.loads((checkpoint / STATE_FILE).read_text())
        start_iter, init_dir, baseline_value = state["iteration"], str(checkpoint), state.get("baseline")
        stream.emit(ev.Log("info", f"resuming from {checkpoint} at iteration {start_iter}"))
    metrics_path = run_dir / "metrics.jsonl"
    _truncate_metrics(metrics_path, start_iter)
    needed_cpus = cfg.rollout.workers + cfg.trainer_workers * cfg.trainer_cpus
    last_ckpt: str | None = str(checkpoint) if checkpoint else None
    values: dict[str, float] = {}
    with ray_cluster(ray_address, num_cpus=needed_cpus) as where, ExitStack() as cleanup:
        gpus = _gpus_per_worker(cfg)
        stream.emit(ev.Log("info", f"using {where}" + (f", {gpus:g} GPU per worker" if gpus else "")))
        engine_opts: dict[str, Any] = {}
        if cfg.rollout.engine == "vllm":
            engine_opts = {"kv_cache_gib": cfg.rollout.kv_cache_gib, "max_model_len": cfg.rollout.max_context,
                           "seed": cfg.seed, "gpu_memory_utilization": 0.8 * gpus if gpus else 0.8}
        hf_config = AutoConfig.from_pretrained(init_dir)
        check_tp_degree(hf_config, cfg.parallelism.train_tp, "parallelism.train_tp")
        shape = ModelShape.from_hf_config(hf_config.to_dict())
        rollout_tps = tp_degrees(cfg.rollout.workers, shape.heads, shape.kv_heads)
        if cfg.parallelism.rollout_tp not in rollout_tps:
            raise ConfigError("parallelism.rollout_tp", f"{cfg.parallelism.rollout_tp} does not split the model's "
                              f"{shape.heads} attention heads / {shape.kv_heads} KV heads over rollout.workers="
                              f"{cfg.rollout.workers}", allowed=rollout_tps)
        trainer = TrainerGroup(init_dir, workers=cfg.trainer_workers, algo=asdict(cfg.algo),
                               reference_dir=_reference_dir(cfg, base, resumed=checkpoint is not None),
                               seed=cfg.seed, temperature=cfg.rollout.temperature or 1.0,
                               num_cpus=cfg.trainer_cpus, num_gpus=gpus, tp=cfg.parallelism.train_tp,
                               # Auto mode starts unsharded; the selector shards when it chooses to.
                               fsdp=cfg.parallelism.train_fsdp and cfg.parallelism.mode == "static")
        cleanup.callback(trainer.close)
        if checkpoint is not None:
            trainer.load_optimizer(str(checkpoint))
        warm = cfg.sft.enabled and checkpoint is None
        if warm:
            if not _warm_start(cfg, trainer, base, stream, should_stop=should_stop):
                # No checkpoint 0: half a warm start is not the starting point; a resume does it again.
                stream.emit(ev.RunStatus("cancelled", "stopped during the warm start"))
                return RunSummary("cancelled", 0, None, {}, str(run_dir))
            # The warm-started policy is checkpoint 0: the starting point RL is measured against, and
            # what --resume restarts from without repeating the warm start.
            last_ckpt = _checkpoint(cfg, trainer, 0, RunningBaseline(cfg.algo.baseline_decay))
        planner = LayoutPlanner(cfg.parallelism, shape=shape, workers=cfg.trainer_workers,
                                default_micro_batch=cfg.algo.micro_batch, emit=stream.emit)
        planner.start(trainer)
        rollout_planner = RolloutPlanner(cfg.parallelism, shape=shape, workers=cfg.rollout.workers,
                                         games=cfg.games_per_iteration, engine=cfg.rollout.engine,
                                         step_tokens=turn_tokens(init_dir, cfg.game.board_format), new_tokens=cfg.rollout.max_new_tokens,
                                         max_context=cfg.rollout.max_context, emit=stream.emit,
                                         whole_devices=gpus in (0, 1))
        built = time.perf_counter()
        rollout = RolloutGroup(init_dir, workers=cfg.rollout.workers, engine=cfg.rollout.engine, engine_opts=engine_opts,
                               num_gpus=gpus, tp=rollout_planner.profile_order()[0])
        cleanup.callback(lambda: rollout.close())
        rollout_planner.start(rollout, built_s=time.perf_counter() - built, weights=trainer.weights)
        # The rollout engines start from the model on disk; after a warm start (or when profiling rebuilt
        # them) they get the trainer's weights. A resume starts them from the checkpoint itself.
        if warm or rollout_planner.auto:
            rollout.load_weights(trainer.weights())
        stream.emit(ev.RunStatus("running", f"iterations {start_iter}..{cfg.iterations}"))
        baseline = RunningBaseline(cfg.algo.baseline_decay, baseline_value)
        dispatcher = Dispatcher(cfg.dispatch.mode, cfg.algo, cfg.dispatch.transport)
        last_records: list[dict[str, Any]] = []
        for it in range(start_iter, cfg.iterations):
            if should_stop():
                last_ckpt = _checkpoint(cfg, trainer, it, baseline)
                stream.emit(ev.RunStatus("cancelled", f"stopped before iteration {it}"))
                return RunSummary("cancelled", it, last_ckpt, values, str(run_dir))
            if should_pause():
                last_ckpt = _checkpoint(cfg, trainer, it, baseline)
                stream.emit(ev.RunStatus("paused", f"checkpointed before iteration {it}; a resume continues there"))
                return RunSummary("paused", it, last_ckpt, values, str(run_dir))
            values, last_records = _iteration(cfg, it, rollout, trainer, baseline, stream, planner, rollout_planner,
                                              dispatcher, last_records)
            with metrics_path.open("a") as fh:
                fh.write(json.dumps({"iteration": it, **values}) + "\n")
            if (it + 1) % cfg.checkpoint_every == 0:
                last_ckpt = _checkpoint(cfg, trainer, it + 1, baseline)
        done = max(cfg.iterations, start_iter)
        final = cfg.run_dir / "checkpoints" / f"iter_{done:06d}"
        if last_ckpt != str(final):  # always end on a checkpoint (also after a warm start alone)
            last_ckpt = _checkpoint(cfg, trainer, done, baseline)
    stream.emit(ev.RunStatus("succeeded", f"{done} iterations"))
    return RunSummary("succeeded", done, last_ckpt, values, str(run_dir))


def turn_tokens(model_dir: str, board_format: str = "rows") -> int:
    """Prompt tokens a game turn adds to the conversation (the opponent's move, the board, the legal columns and
    the assistant header): what each rollout turn prefills on top of the cached conversation."""
    encoder = ChatEncoder(AutoTokenizer.from_pretrained(model_dir))
    board = Board.from_moves("4453")
    prompt = protocol.turn_prompt(board, 2, board_format)
    return len(encoder.message("user", prompt)) + len(encoder.generation_prompt())


def _iteration(cfg: RunConfig, it: int, rollout: RolloutGroup, trainer: TrainerGroup, baseline: RunningBaseline,
               stream: ev.EventStream, planner: LayoutPlanner, rollout_planner: RolloutPlanner,
               dispatcher: Dispatcher, last_records: list[dict[str, Any]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    t0 = time.perf_counter()
    sampling = {"max_new_tokens": cfg.rollout.max_new_tokens, "temperature": cfg.rollout.temperature,
                "top_p": cfg.rollout.top_p, "seed": cfg.seed + it}
    limits = asdict(run_limits(cfg))
    rollout_planner.before_rollout(it, last_records, cfg.iterations - it, rollout, trainer.weights)
    t_play = time.perf_counter()
    played = rollout.play(iteration_specs(cfg, it), sampling, limits)
    records = played["records"]  # metadata: the token tensors stay on the engines until dispatched
    rollout_selection = rollout_planner.after_rollout(records, played["seconds"])
    # The layouts first: the dispatch plan follows the trainer's layout of this iteration.
    planner.before_iteration(it, records, cfg.iterations - it, trainer)
    try:
        report = dispatcher.dispatch(played, rollout, trainer, baseline)
    finally:
        rollout.release()
    _emit_dispatch(stream, it, report)
    t1 = time.perf_counter()
    train_metrics = trainer.rl_step_received()
    train_metrics.update(planner.after_iteration(train_metrics, records))
    t2 = time.perf_counter()
    sync_s = rollout.load_weights(trainer.weights())
    t3 = time.perf_counter()
    values = {
        **rollout_metrics(records),
        **train_metrics,
        **rollout_selection,
        "perf/rollout_layout_s": t_play - t0,
        "perf/rollout_s": played["seconds"],
        "perf/rollout_tokens_per_s": played["generated_tokens"] / max(played["seconds"], 1e-9),
        "perf/generated_tokens": float(played["generated_tokens"]),
        "perf/weight_sync_s": t3 - t2,
        "perf/weight_load_s": sync_s,
        "perf/iteration_s": t3 - t0,
        "perf/train_step_s": t2 - t1,
        "perf/dispatch_s": report.seconds,
        "dispatch/bytes_moved": float(report.bytes_moved),
        "dispatch/bytes_via_driver": float(report.bytes_via_driver),
        "dispatch/network_tokens": float(report.network_tokens),
    }
    _emit_metrics(stream, it, values)
    trainers = [{**w, "budget": cfg.parallelism.budget_bytes} for w in trainer.memory()]
    stream.emit(ev.MemoryReading(iteration=it, workers=rollout.memory() + trainers))
    _emit_sample_game(stream, it, records[0])
    return values, records


def _emit_dispatch(stream: ev.EventStream, it: int, report: DispatchReport) -> None:
    stream.emit(ev.Dispatch(iteration=it, bytes_moved=report.bytes_moved, bytes_via_driver=report.bytes_via_driver,
                            seconds=report.seconds, fields=report.fields))


def _emit_metrics(stream: ev.EventStream, it: int, values: dict[str, float]) -> None:
    """Metrics event with non-finite values left out (JSON has no NaN) and named in a warning instead."""
    finite = {k: v for k, v in values.items() if math.isfinite(v)}
    if len(finite) < len(values):
        bad = sorted(set(values) - set(finite))
        stream.emit(ev.Log("warning", f"iteration {it}: non-finite metrics left out: {', '.join(bad)}"))
    stream.emit(ev.Metrics(iteration=it, values=finite))


def _emit_sample_game(stream: ev.EventStream, it: int, record: dict[str, Any]) -> None:
    for m in record["moves"]:
        stream.emit(ev.GameMove(iteration=it, game=record["index"], ply=m["ply"], player=m["player"],
                                column=m["column"], board=m["board"], text=m["text"], context_tokens=m["context_tokens"]))
    stream.emit(ev.GameEnd(iteration=it, game=record["index"], result=record["result"], reward=record["reward"],
                           moves=record["board_moves"], agent_side=record["agent_side"], opponent=record["opponent"]))


def _checkpoint(cfg: RunConfig, trainer: TrainerGroup, iteration: int, baseline: RunningBaseline) -> str:
    path = cfg.run_dir / "checkpoints" / f"iter_{iteration:06d}"
    return trainer.save(str(path), {"iteration": iteration, "baseline": baseline.value, "config": cfg.to_dict()})


def warm_start_data(cfg: RunConfig, encoder: ChatEncoder) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What the warm start imitates: the teacher's games (episode records) and its one-turn positions packed
    `sft.positions_per_conversation` to a conversation (none where sft.positions is 0)."""
    teacher = make_opponent(cfg.sft.teacher)
    opponents = opponent_list(cfg.sft.opponents, "sft.opponents")
    specs = [GameSpec(index=i, group=i, agent_side=1 + i % 2, opponent=make_opponent(opponents[(i // 2) % len(opponents)]),
                      seed=cfg.seed * 7919 + i)
             for i in range(cfg.sft.games)]
    policy = teacher_policy(teacher, encoder, seed=cfg.seed, mistake_rate=cfg.sft.mistake_rate,
                            board_format=cfg.game.board_format)
    episodes = play_episodes(specs, policy, encoder,
                             limits=RunnerLimits(max_context=cfg.rollout.max_context,
                                                 board_format=cfg.game.board_format, board_view=cfg.game.board_view))
    records = [e.record() for e in episodes]
    positions: list[dict[str, Any]] = []
    if cfg.sft.positions:
        turns = (game_turns(records) if cfg.sft.position_source == "games"
                 else mixed_play_turns(teacher, _mixed_games(cfg), seed=cfg.seed))
        positions = one_turn_positions(turns, encoder, cfg.sft.positions, seed=cfg.seed,
                                       board_format=cfg.game.board_format, board_view=cfg.game.board_view,
                                       per_conversation=cfg.sft.positions_per_conversation,
                                       mistake_rate=cfg.sft.mistake_rate)
    return records, positions


def _mixed_games(cfg: RunConfig) -> int:
    """Mixed-play games that the warm start's positions are cut from (0 where they come from the teacher games)."""
    return (max(1, cfg.sft.positions // MIXED_POSITIONS_PER_GAME)
            if cfg.sft.positions and cfg.sft.position_source == "mixed" else 0)


def _warm_start(cfg: RunConfig, trainer: TrainerGroup, base: str, stream: ev.EventStream, *,
                should_stop: Callable[[], bool]) -> bool:
    """Imitate a teacher's moves (SFT on whole conversations, and on one-turn positions where configured) before
    RL; False when a stop request ended it between two steps."""
    encoder = ChatEncoder(AutoTokenizer.from_pretrained(base))
    mixed_games = _mixed_games(cfg)
    # A solver teacher can take minutes here: say what is being played before the first step's metrics.
    stream.emit(ev.Log("info", f"warm start: {cfg.sft.teacher} teacher playing {cfg.sft.games} games against"
                               f" {cfg.sft.opponents}" + (f" and {mixed_games} mixed-play games" if mixed_games else "")))
    started = time.monotonic()
    records, positions = warm_start_data(cfg, encoder)
    prepare_s = time.monotonic() - started
    stream.emit(ev.Log("info", f"warm start: {len(records)} {cfg.sft.teacher} games against {cfg.sft.opponents}"
                                + (f" and {cfg.sft.positions} positions ({cfg.sft.position_source}) in"
                                   f" {len(positions)} conversations" if positions else "")
                                + f", {cfg.sft.epochs} epochs (prepared in {prepare_s:.0f} s)"))
    lr = cfg.sft.lr
    for epoch in range(cfg.sft.epochs):
        rng = random.Random(cfg.seed + epoch)
        batches = [*sft_batches(records, cfg.sft.batch, rng, batching=cfg.sft.batching),
                   *sft_batches(positions, cfg.sft.batch, rng, batching=cfg.sft.batching)]
        rng.shuffle(batches)
        batches = [chunk for chunk in batches if len(chunk) >= cfg.trainer_workers]  # a conversation for every rank
        losses: list[float] = []
        epoch_started, every = time.monotonic(), max(1, len(batches) // SFT_PROGRESS_LINES)
        for step, chunk in enumerate(batches, 1):
            if should_stop():
                stream.emit(ev.Log("info", f"warm start stopped by request in epoch {epoch + 1}"))
                return False
            # Every epoch cuts the same batch sizes, so all epochs together make len(batches) * epochs steps.
            lr = scheduled_lr(cfg.sft.lr, cfg.sft.lr_schedule, epoch * len(batches) + step - 1,
                              len(batches) * cfg.sft.epochs)
            losses.append(trainer.sft_step(chunk, lr)["sft/loss"])
            if step % every == 0 and step < len(batches):
                _log_sft_progress(stream, epoch, step, len(batches), losses[-every:], time.monotonic() - epoch_started)
        # Wall times, so a run's cost splits into preparing the teacher data, the warm start's steps and RL.
        _emit_metrics(stream, epoch, {"sft/loss": sum(losses) / max(len(losses), 1), "sft/epoch": float(epoch + 1),
                                      "sft/steps": float(len(losses)), "sft/lr": lr,
                                      "sft/seconds": time.monotonic() - epoch_started,
                                      "sft/prepare_seconds": prepare_s})
    trainer.reset_optimizer()
    # RL's KL penalty holds the policy near where RL starts (the warm-started one, as InstructGPT's SFT model),
    # not near the random weights the warm start began with: those pull it back to noise.
    trainer.reset_reference()
    return True


def _log_sft_progress(stream: ev.EventStream, epoch: int, step: int, steps: int, recent: list[float],
                      elapsed_s: float) -> None:
    """Where a warm-start epoch is: its step, the mean loss of the `recent` steps, the time left at this pace."""
    left_s = elapsed_s / step * (steps - step)
    stream.emit(ev.Log("info", f"warm start epoch {epoch + 1}: step {step}/{steps}, loss {sum(recent) / len(recent):.3f}"
                               f" over the last {len(recent)} steps, about {left_s / 60:.1f} min left in the epoch"))
