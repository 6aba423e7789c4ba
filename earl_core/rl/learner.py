"""The policy learner: PPO-style multi-turn GRPO / REINFORCE steps, the SFT warm start, and checkpoints.

Plain PyTorch on one process. Data parallelism is a `reduce` hook (sum across ranks) that the Ray trainer
worker fills with torch.distributed; with the default identity it trains alone. Tensor parallelism splits the
model across a `tp_mesh` with torch.distributed.tensor.parallel (earl_core.parallel.tensor_parallel). With a
`dp_mesh` and ``fsdp=True`` the trained model is sharded over the data-parallel ranks with FSDP2
(`torch.distributed.fsdp.fully_shard`): each rank stores 1/DP of the parameters, gradients and Adam moments.
Both at once is 2-D (the meshes are the two dimensions of one (dp, tp) mesh): FSDP shards the TP shards.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer

from earl_core.checkpoints import STATE_FILE, fsync_dir, fsync_tree
from earl_core.config import AlgoConfig
from earl_core.parallel.probe import PeakMemory
from earl_core.parallel.tensor_parallel import (check_tp_degree, clip_grad_norm, full_optimizer_state,
                                                full_state_dict, load_full_optimizer_state, load_full_state_dict,
                                                local, shard_model)
from earl_core.rl.advantages import answer_weights
from earl_core.rl.batch import TrainBatch, micro_batch_indices, micro_batches, mini_batch_rows, pack
from earl_core.rl.losses import clipped_policy_loss, kl_to_reference, token_logprobs

Reduce = Callable[[torch.Tensor], torch.Tensor]


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _enable_checkpointing(model: torch.nn.Module) -> None:
    # Non-reentrant checkpointing works with inputs that need no grad (token ids).
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _check_fsdp(fsdp: bool, dp_mesh: DeviceMesh | None) -> bool:
    """Whether FSDP is on: asked for, with more than one data-parallel rank."""
    return bool(fsdp and dp_mesh is not None)


class Learner:
    """Holds the trained policy, its optimiser and (when KL is on) a frozen reference copy."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        algo: AlgoConfig,
        reference_dir: str | Path | None = None,
        seed: int = 0,
        temperature: float = 1.0,
        reduce: Reduce = _identity,
        tp_mesh: DeviceMesh | None = None,
        dp_mesh: DeviceMesh | None = None,
        fsdp: bool = False,
    ) -> None:
        torch.manual_seed(seed)
        # Tensor parallelism: the model (and the reference) split across the ranks of `tp_mesh`, which all
        # see the same data; `reduce` then sums over data-parallel peers only.
        self.tp_mesh = tp_mesh if tp_mesh is not None and tp_mesh.size() > 1 else None
        # FSDP over the data-parallel ranks (with TP too: 2-D). Off with one data-parallel rank.
        self.dp_mesh = dp_mesh if dp_mesh is not None and dp_mesh.size() > 1 else None
        self.fsdp = _check_fsdp(fsdp, self.dp_mesh)
        # Rollouts sample from softmax(logits / T); the ratio must compare the same distribution.
        self.temperature = temperature
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.algo = algo
        self.model_dir = Path(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device)
        self._split(self.model)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model.train()
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.optimizer = self._new_optimizer()
        self.reference = None
        if algo.kl_coef > 0:
            self.reference = AutoModelForCausalLM.from_pretrained(reference_dir or model_dir, dtype=torch.float32)
            self.reference.to(self.device).eval().requires_grad_(False)
            if self.tp_mesh is not None:
                shard_model(self.reference, self.tp_mesh)
        self._reduce = reduce
        self.steps = 0
        # Layout knobs the Parallelism Selector may change between iterations (start from the config).
        self.train_micro_batch = algo.micro_batch
        self.experience_micro_batch = algo.micro_batch
        self.checkpointing = False

    # ---- forward passes -------------------------------------------------------------------------
    def _logprobs(self, model: torch.nn.Module, mb: TrainBatch) -> torch.Tensor:
        # Sequences are right-padded, so under causal attention no real token ever sees a pad: the padding
        # mask can be left out. Without it attention takes the fused causal path (~1.7x faster on CPU);
        # the logits at pad positions are garbage but carry zero weight in every loss.
        out = model(input_ids=mb.input_ids.to(self.device))
        return token_logprobs(out.logits / self.temperature, mb.input_ids.to(self.device))  # (b, t-1)

    @torch.no_grad()
    def _fill(self, model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
        """Log-probs of the whole batch under `model`, computed micro-batch by micro-batch."""
        out = torch.zeros_like(batch.action_mask)
        chunks = list(micro_batch_indices(batch, self.experience_micro_batch))
        idle = self._lockstep(len(chunks)) - len(chunks) if model is self.model else 0
        for idx in chunks:
            lp = self._logprobs(model, batch.slice(idx)).cpu()
            out[idx, : lp.shape[1]] = lp
        for _ in range(idle):
            self._idle_pass(backward=False)
        return out

    def _lockstep(self, count: int) -> int:
        """Under FSDP every forward pass is a collective (its parameters are all-gathered), so the ranks must run
        as many passes as the rank with the most micro-batches: the agreed count. Otherwise ``count``. Called
        before the first pass (a collective of its own, it must not interleave with theirs)."""
        if not self.fsdp:
            return count
        agreed = torch.tensor([count], dtype=torch.long, device=self.device)  # NCCL reduces CUDA tensors only
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.dp_mesh.get_group())
        return int(agreed.item())

    def _idle_pass(self, *, backward: bool) -> None:
        """A pass over one pad token that adds nothing: keeps this rank in step with its FSDP peers."""
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)
        with torch.set_grad_enabled(backward):
            logits = self.model(input_ids=ids).logits
            if backward:
                (logits.sum() * 0.0).backward()

    # ---- RL -----------------------------------------------------------------------------------------
    def prepare(self, records: Sequence[dict[str, Any]], advantages: Sequence[float] | torch.Tensor) -> TrainBatch:
        """Experience preparation: pack, then old (behaviour) and reference log-probs."""
        batch = pack(records, advantages, pad_id=self.pad_id)
        was_training = self.model.training
        self.model.eval()
        batch.old_logprobs = self._fill(self.model, batch)
        self.model.train(was_training)
        if self.reference is not None:
            batch.ref_logprobs = self._fill(self.reference, batch)
        return batch

    def measured_rl_step(self, records: Sequence[dict[str, Any]],
                         advantages: Sequence[float] | torch.Tensor) -> dict[str, float]:
        """prepare() then rl_step(), each stage timed and its peak memory measured (what the selector reads)."""
        start = time.perf_counter()
        with PeakMemory() as experience_peak:
            batch = self.prepare(records, advantages)
        prepared = time.perf_counter()
        with PeakMemory() as train_peak:
            metrics = self.rl_step(batch)
        end = time.perf_counter()
        return {**metrics, "perf/experience_s": prepared - start, "perf/train_s": end - prepared,
                "memory/experience_peak_bytes": float(experience_peak.bytes),
                "memory/train_peak_bytes": float(train_peak.bytes)}

    def rl_step(self, batch: TrainBatch) -> dict[str, float]:
        """`algo.epochs` passes over the batch, each `algo.mini_batches` optimiser steps on parts of it; a step's
        loss is the mean over its part's agent tokens of all ranks, each token weighted by its answer's credit
        (`algo.turn_discount`; 1 by default). Metrics are the last epoch's."""
        assert batch.old_logprobs is not None, "call prepare() first"
        metrics: dict[str, float] = {}
        for _ in range(self.algo.epochs):
            # policy, kl, clipped, ratio, credit-weighted tokens (the mean's divisor), tokens; summed over the parts
            sums = torch.zeros(6, dtype=torch.float64)
            norms: list[float] = []
            # Seeded by the step count (restored on resume): a rerun deals the same parts. Each rank deals its own
            # games; the ranks agree on the number of parts (config), and step k reduces part k of every rank.
            for rows in mini_batch_rows(batch.size, self.algo.mini_batches, random.Random(self.steps)):
                part = self._policy_gradients(batch, rows)
                norms.append(self._apply_gradients(part))  # reduces `part` over the ranks in place
                sums += part
            tokens = max(sums[4].item(), 1.0)
            metrics = {
                "losses/policy_loss": sums[0].item() / tokens,
                "losses/kl": sums[1].item() / tokens,
                "losses/clip_frac": sums[2].item() / tokens,
                "losses/ratio_mean": sums[3].item() / tokens,
                "losses/grad_norm": sum(norms) / len(norms),
                "perf/train_tokens": sums[5].item(),
            }
        return metrics

    def _policy_gradients(self, batch: TrainBatch, rows: list[int]) -> torch.Tensor:
        """Zero the gradients, then accumulate the clipped policy loss (plus the KL penalty) of `rows` of `batch`,
        micro-batch by micro-batch, as sums over their tokens. Returns the sums: policy, kl, clipped, ratio,
        credit-weighted tokens, tokens. No rows (a rank with fewer games than parts) contribute nothing, but the
        rank still joins the step's collectives."""
        sums = torch.zeros(6, dtype=torch.float64)
        self.optimizer.zero_grad(set_to_none=True)
        chunks = list(micro_batches(batch.slice(rows), self.train_micro_batch)) if rows else []
        idle = self._lockstep(len(chunks)) - len(chunks)
        for mb in chunks:
            if float(mb.action_mask.sum()) == 0 and not self.fsdp:  # under FSDP every pass counts for the lockstep
                continue
            # Every per-token term and the token count carry the answer's credit (the plain mask by default).
            mask = answer_weights(mb.action_mask, self.algo.turn_discount).to(self.device)
            logp = self._logprobs(self.model, mb)
            pg, clipped, ratio = clipped_policy_loss(
                logp, mb.old_logprobs.to(self.device), mb.advantages.to(self.device), mask, clip_eps=self.algo.clip_eps
            )
            loss = pg
            kl = torch.zeros((), device=self.device)
            if self.reference is not None and self.algo.kl_coef > 0:
                kl = kl_to_reference(logp, mb.ref_logprobs.to(self.device), mask)
                loss = loss + self.algo.kl_coef * kl
            loss.backward()
            sums += torch.tensor([pg.item(), kl.item(), clipped.item(), ratio.item(), mask.sum().item(),
                                  mb.action_mask.sum().item()], dtype=torch.float64)
        for _ in range(idle):
            self._idle_pass(backward=True)
        return sums

    def _apply_gradients(self, sums: torch.Tensor) -> float:
        """Average gradients over every agent token of every rank, clip, step. `sums` is reduced in place."""
        # Collectives run on the model's device (NCCL reduces only CUDA tensors; gloo takes CPU ones).
        sums.copy_(self._reduce(sums.to(self.device)).cpu())
        tokens = max(sums[4].item(), 1.0)
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.fsdp:
            # FSDP already averaged each shard's gradient over the data-parallel ranks (reduce-scatter) during
            # backward: times the rank count makes the sum, then the mean over the tokens of all ranks. (A
            # divide factor of 1 would save the multiply, but gloo has no PREMUL_SUM for it.) Squares for the
            # norm sum over the shards of every rank.
            scale = self.dp_mesh.size() / tokens
            for p in params:
                local(p.grad).mul_(scale)
            norm = clip_grad_norm(params, self.algo.max_grad_norm)
            self.optimizer.step()
            self.steps += 1
            return float(norm)
        # Under TP each rank reduces its own shards with its data-parallel peers (who hold the same shards).
        grads = [local(p.grad) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # one collective for all parameters
        flat = self._reduce(flat) / tokens
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n
        norm = clip_grad_norm(params, self.algo.max_grad_norm)
        self.optimizer.step()
        self.steps += 1
        return float(norm)

    # ---- SFT warm start --------------------------------------------------------------------------
    def sft_step(self, records: Sequence[dict[str, Any]], *, lr: float | None = None) -> dict[str, float]:
        """One optimiser step of cross-entropy on the agent tokens of teacher games."""
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        batch = pack(records, torch.zeros(len(records)), pad_id=self.pad_id)
        sums = torch.zeros(5, dtype=torch.float64)
        self.optimizer.zero_grad(set_to_none=True)
        chunks = list(micro_batches(batch, self.train_micro_batch))
        idle = self._lockstep(len(chunks)) - len(chunks)
        for mb in chunks:
            mask = mb.action_mask.to(self.device)
            nll = -(self._logprobs(self.model, mb) * mask).sum()
            nll.backward()
            sums[0] += nll.item()
            sums[4] += mask.sum().item()
        for _ in range(idle):
            self._idle_pass(backward=True)
        grad_norm = self._apply_gradients(sums)
        return {"sft/loss": sums[0].item() / max(sums[4].item(), 1.0), "sft/grad_norm": grad_norm}

    # ---- layouts (Parallelism Selector) ---------------------------------------------------------
    def set_layout(self, stage: str, micro_batch: int, checkpointing: bool = False) -> None:
        """Micro-batch of the experience or train stage; for training also activation checkpointing."""
        if stage == "experience":
            self.experience_micro_batch = micro_batch
            return
        if stage != "train":
            raise ValueError(f"the learner runs the experience and train stages, not {stage!r}")
        self.train_micro_batch = micro_batch
        if checkpointing != self.checkpointing:
            if checkpointing:
                _enable_checkpointing(self.model)
            else:
                self.model.gradient_checkpointing_disable()
            self.checkpointing = checkpointing

    def profile(self, stage: str, micro_batch: int, context: int, checkpointing: bool = False, *,
                seed: int = 0) -> dict[str, float]:
        """Time and peak memory of one micro-batch of ``micro_batch`` x ``context`` random tokens.

        Train: forward and backward (gradients discarded, weights and optimizer untouched); experience: a
        forward pass without gradients. Tokens per second count every position processed. A device out-of-memory
        error is reported (``out_of_memory``: 1, ``tokens_per_s``: 0), not raised: profiling is how a layout that
        does not fit is found out.
        """
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, int(self.model.config.vocab_size), (micro_batch, context), generator=gen)
        batch = TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids),
                           action_mask=torch.ones((micro_batch, context - 1)), advantages=torch.zeros(micro_batch))
        previous = (self.train_micro_batch, self.checkpointing)
        if stage == "train":
            self.set_layout("train", micro_batch, checkpointing)
        start = time.perf_counter()
        try:
            with PeakMemory() as peak:
                if stage == "train":
                    loss = -(self._logprobs(self.model, batch) * batch.action_mask.to(self.device)).mean()
                    loss.backward()
                    self.model.zero_grad(set_to_none=True)
                    del loss
                else:
                    with torch.no_grad():
                        self._logprobs(self.model, batch)
            seconds = time.perf_counter() - start
        except torch.OutOfMemoryError:
            # Only a device allocator raises this (on GPU, or under a per-process memory fraction): the layout
            # does not fit this context. Report it, with what it had reached when it failed (a lower bound).
            reached = float(torch.cuda.max_memory_allocated())
            self.model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            return {"seconds": time.perf_counter() - start, "tokens_per_s": 0.0, "out_of_memory": 1.0,
                    "peak_bytes": reached}
        finally:
            if stage == "train":
                self.set_layout("train", *previous)
        return {"seconds": seconds, "tokens_per_s": micro_batch * context / max(seconds, 1e-9),
                "peak_bytes": float(peak.bytes)}

    def relayout(self, tp_mesh: DeviceMesh | None, *, dp_mesh: DeviceMesh | None = None, fsdp: bool = False) -> None:
        """Move the policy, its optimizer state and the reference to another TP split or FSDP sharding, in memory.

        Every rank of the old and of the new groups calls it. Full tensors are gathered from the old split and
        each rank keeps its slice of the new one (bit-exact: nothing is recomputed)."""
        new_mesh = tp_mesh if tp_mesh is not None and tp_mesh.size() > 1 else None
        new_dp = dp_mesh if dp_mesh is not None and dp_mesh.size() > 1 else None
        if new_mesh is not None:
            check_tp_degree(self.model.config, new_mesh.size())
        new_fsdp = _check_fsdp(fsdp, new_dp)
        weights = full_state_dict(self.model)
        optimizer = full_optimizer_state(self.model, self.optimizer)
        reference = full_state_dict(self.reference) if self.reference is not None else None
        self.tp_mesh, self.dp_mesh, self.fsdp = new_mesh, new_dp, new_fsdp
        self.model = self._rebuild(weights, trained=True)
        self.model.train()
        if self.checkpointing:
            _enable_checkpointing(self.model)
        self.optimizer = self._new_optimizer()
        load_full_optimizer_state(self.model, self.optimizer, optimizer)
        if reference is not None:
            self.reference = self._rebuild(reference).eval().requires_grad_(False)

    def _rebuild(self, weights: dict[str, torch.Tensor], *, trained: bool = False) -> torch.nn.Module:
        """A model of the same config on this learner's current split, holding ``weights``."""
        model = AutoModelForCausalLM.from_config(self.model.config, dtype=torch.float32).to(self.device)
        self._split(model, trained=trained)
        load_full_state_dict(model, weights)
        return model

    def _split(self, model: torch.nn.Module, *, trained: bool = True) -> None:
        """Apply this learner's layout to a freshly loaded model: TP split, and FSDP for the trained model (the
        frozen reference stays whole: it has no gradients or optimizer state to shard)."""
        if self.tp_mesh is not None:
            shard_model(model, self.tp_mesh)
        if self.fsdp and trained:
            # One FSDP unit per decoder layer (its parameters are gathered only while it runs), then the rest.
            for layer in model.model.layers:
                fully_shard(layer, mesh=self.dp_mesh)
            fully_shard(model, mesh=self.dp_mesh)

    def reset_reference(self) -> None:
        """Make the KL reference a frozen copy of the policy as it is now: after a warm start, the policy RL starts
        from (not the random weights the warm start began with). Every rank calls it (the copy gathers TP shards)."""
        if self.reference is not None:
            self.reference = self._rebuild(full_state_dict(self.model)).eval().requires_grad_(False)

    def reset_lr(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.algo.lr

    def reset_optimizer(self) -> None:
        """Fresh AdamW state at the RL learning rate (the warm start's moments do not carry over)."""
        self.optimizer = self._new_optimizer()

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=self.algo.lr, betas=(0.9, 0.99), weight_decay=0.0)

    # ---- weights and checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """CPU copy of the full weights, in Hugging Face parameter names (what rollout engines load). Under TP
        a collective: every rank of the TP group must call it."""
        return full_state_dict(self.model)

    def save(self, path: str | Path, *, extra: dict[str, Any] | None = None, write: bool = True) -> Path:
        """Hugging Face folder + optimiser state, written to a temp folder and renamed (never half written).

        Under TP every rank of the group calls it (weights and optimizer state are gathered) and only the one
        with ``write`` writes; the files are the same as a TP=1 learner's, so they load under any layout."""
        weights = full_state_dict(self.model)
        optimizer = full_optimizer_state(self.model, self.optimizer)
        final = Path(path)
        if not write:
            return final
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.model.save_pretrained(tmp, state_dict=weights)
        # The tokenizer's own save writes every file it needs, also when the model came from a hub id.
        self.tokenizer.save_pretrained(tmp)
        generation_config = self.model_dir / "generation_config.json"
        if generation_config.exists() and not (tmp / "generation_config.json").exists():
            shutil.copy2(generation_config, tmp / "generation_config.json")
        torch.save({"optimizer": optimizer, "steps": self.steps}, tmp / "trainer_state.pt")
        (tmp / STATE_FILE).write_text(json.dumps(extra or {}, indent=2))
        fsync_tree(tmp)
        # An older folder of the same iteration is renamed away first (one atomic step), never deleted in place:
        # a crash while deleting would leave a folder that still has its state file but lacks weights.
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)
        return final

    def load_optimizer(self, checkpoint: str | Path) -> None:
        state = torch.load(Path(checkpoint) / "trainer_state.pt", map_location=self.device, weights_only=False)
        load_full_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.steps = int(state["steps"])
        self.reset_lr()  # the saved state carries the old learning rate; the config in force wins
