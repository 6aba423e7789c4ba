"""Shipments: the bulk fields of some samples packed into flat tensors, and the metadata the driver keeps.

A finished game's record splits in two: the bulk (token ids, the agent-token mask, the behaviour log-probs) stays
with the worker that played it and travels in a Shipment to the ranks that train on it; the rest (sample id, group,
reward, lengths, result) is metadata, a few hundred bytes, and is all the driver sees in the layout-aware mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

BULK_FIELDS = ("token_ids", "action_mask", "logprobs")
"""Record fields that are per-token tensors: they never go to the driver in the layout-aware mode."""


def metadata(record: Mapping[str, Any], *, keep_moves: bool = False) -> dict[str, Any]:
    """A record without its per-token fields (``tokens`` says how long it is). The move list, with the agent's
    text, is kept only for the game the dashboard shows."""
    meta = {k: v for k, v in record.items() if k not in BULK_FIELDS}
    meta["tokens"] = len(record["token_ids"])
    if not keep_moves:
        meta["moves"] = []
    return meta


@dataclass
class Shipment:
    """Some samples' bulk fields, flat: sample ``i`` spans ``offsets[i]:offsets[i + 1]`` of the per-token tensors."""

    ids: torch.Tensor  # (S,) int64 sample ids
    groups: torch.Tensor  # (S,) int64 GRPO groups
    rewards: torch.Tensor  # (S,) float64
    offsets: torch.Tensor  # (S + 1,) int64
    token_ids: torch.Tensor  # (N,) int32
    action_mask: torch.Tensor  # (N,) uint8
    advantages: torch.Tensor | None = None  # (S,) float32, only when computed centrally

    @classmethod
    def pack(cls, records: Sequence[Mapping[str, Any]], advantages: Sequence[float] | None = None) -> Shipment:
        lengths = [len(r["token_ids"]) for r in records]
        offsets = torch.zeros(len(records) + 1, dtype=torch.int64)
        if records:
            offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        flat_ids = [t for r in records for t in r["token_ids"]]
        flat_mask = [m for r in records for m in r["action_mask"]]
        return cls(
            ids=torch.tensor([int(r["index"]) for r in records], dtype=torch.int64),
            groups=torch.tensor([int(r["group"]) for r in records], dtype=torch.int64),
            rewards=torch.tensor([float(r["reward"]) for r in records], dtype=torch.float64),
            offsets=offsets,
            token_ids=torch.tensor(flat_ids, dtype=torch.int32),
            action_mask=torch.tensor(flat_mask, dtype=torch.uint8),
            advantages=None if advantages is None else torch.tensor(list(advantages), dtype=torch.float32),
        )

    @classmethod
    def concat(cls, parts: Sequence[Shipment]) -> Shipment:
        """One shipment holding every sample of ``parts`` (in that order); advantages only if all parts carry them."""
        lengths = torch.cat([p.offsets[1:] - p.offsets[:-1] for p in parts])
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        with_adv = all(p.advantages is not None for p in parts)
        return cls(ids=torch.cat([p.ids for p in parts]), groups=torch.cat([p.groups for p in parts]),
                   rewards=torch.cat([p.rewards for p in parts]), offsets=offsets,
                   token_ids=torch.cat([p.token_ids for p in parts]),
                   action_mask=torch.cat([p.action_mask for p in parts]),
                   advantages=torch.cat([p.advantages for p in parts]) if with_adv else None)  # type: ignore[misc]

    def subset(self, ids: Sequence[int]) -> Shipment:
        """The samples ``ids`` (in that order) as a new shipment: tensor slices, no per-token Python work."""
        where = {int(s): i for i, s in enumerate(self.ids.tolist())}
        rows = [where[int(s)] for s in ids]
        spans = [(int(self.offsets[i]), int(self.offsets[i + 1])) for i in rows]
        pick = torch.tensor(rows, dtype=torch.int64)
        lengths = torch.tensor([b - a for a, b in spans], dtype=torch.int64)
        offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        def cut(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t[a:b] for a, b in spans]) if spans else t[:0].clone()
        return Shipment(ids=self.ids[pick], groups=self.groups[pick], rewards=self.rewards[pick], offsets=offsets,
                        token_ids=cut(self.token_ids), action_mask=cut(self.action_mask),
                        advantages=None if self.advantages is None else self.advantages[pick])

    def __len__(self) -> int:
        return int(self.ids.numel())

    def field_bytes(self) -> dict[str, int]:
        """Bytes per field, as the dispatch event reports them (ids, groups and offsets count as the samples')."""
        index = sum(t.numel() * t.element_size() for t in (self.ids, self.groups, self.offsets))
        out = {"token_ids": _nbytes(self.token_ids) + index, "action_mask": _nbytes(self.action_mask),
               "rewards": _nbytes(self.rewards)}
        if self.advantages is not None:
            out["advantages"] = _nbytes(self.advantages)
        return out

    @property
    def nbytes(self) -> int:
        return sum(self.field_bytes().values())

    def records(self) -> list[dict[str, Any]]:
        """The samples as training records (token_ids, action_mask, index, group, reward), in shipment order."""
        out = []
        for i in range(len(self)):
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            out.append({"index": int(self.ids[i]), "group": int(self.groups[i]), "reward": float(self.rewards[i]),
                        "token_ids": self.token_ids[a:b].tolist(), "action_mask": self.action_mask[a:b].tolist()})
        return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class DispatchError(RuntimeError):
    """A destination rank did not receive exactly the samples its plan promised."""


def assemble(shipments: Sequence[Shipment], expected: Sequence[int]) -> tuple[list[dict[str, Any]], list[float] | None]:
    """The records a rank trains on, in the order it expects, plus the advantages when they came with the data.
    Every expected sample must arrive exactly once and nothing else may arrive."""
    found: dict[int, tuple[dict[str, Any], float | None]] = {}
    for shipment in shipments:
        advantages = shipment.advantages.tolist() if shipment.advantages is not None else [None] * len(shipment)
        for record, adv in zip(shipment.records(), advantages):
            sid = record["index"]
            if sid in found:
                raise DispatchError(f"sample {sid} arrived twice")
            found[sid] = (record, adv)
    wanted = set(expected)
    extra = sorted(set(found) - wanted)
    missing = sorted(wanted - set(found))
    if missing or extra:
        raise DispatchError(f"samples missing: {missing[:10]}; not expected: {extra[:10]}")
    records = [found[s][0] for s in expected]
    advs = [found[s][1] for s in expected]
    if all(a is None for a in advs):
        return records, None
    if any(a is None for a in advs):
        raise DispatchError("advantages came with some samples and not with others")
    return records, [float(a) for a in advs]  # type: ignore[arg-type]
