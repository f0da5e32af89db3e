"""GROM's keys: the key positions of the encoded examples (`grom.data.encoding`), subsampled
to a budget with a seeded generator before any forward pass, and their gold tokens. Keys
stay grouped by example (`example` of each position) for the influence audit."""
from __future__ import annotations

from typing import Sequence

import torch

from grom.data.encoding import Encoded


def gold_tokens(encoded: Sequence[Encoded]) -> torch.Tensor:
    """All gold tokens of all key positions, (total,)."""
    return torch.tensor([g for e in encoded for g in e.gold], dtype=torch.long)


def subsample(encoded: Sequence[Encoded], budget: int | None, seed: int) -> list[Encoded]:
    """Keep at most `budget` key positions in all, chosen uniformly with a seeded generator."""
    total = sum(len(e.positions) for e in encoded)
    if budget is None or total <= budget:
        return list(encoded)
    g = torch.Generator().manual_seed(seed)
    keep = torch.zeros(total, dtype=torch.bool)
    keep[torch.randperm(total, generator=g)[:budget]] = True
    out, at = [], 0
    for e in encoded:
        mask = keep[at:at + len(e.positions)].tolist()
        at += len(e.positions)
        pos = tuple(p for p, k in zip(e.positions, mask) if k)
        if pos:
            gold = tuple(t for t, k in zip(e.gold, mask) if k)
            out.append(Encoded(e.input_ids[: max(pos) + 1], pos, gold, e.example))
    return out
