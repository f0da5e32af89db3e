"""A digest of a model's weights: what a result computed from the weights alone (a result
card, the unedited model's side of the attack suite) is kept under on disk, so that the same
weights find it again and any other weights do not."""
from __future__ import annotations

import hashlib

import torch

SAMPLED = 4096  # values of each parameter read into the fingerprint, spread over the tensor


@torch.no_grad()
def weights_fingerprint(model) -> str:
    """A digest of `model`'s weights as they are now: every parameter's name, shape, dtype,
    the sum of its raw bits read as integers and `SAMPLED` values spread over it
    (SmolLM2-135M: 0.3 s on a CPU). Integer sums are exact, so the digest is the same on
    every machine, device and thread count (a float sum's last digits follow the order of
    its additions): a card computed ahead on one host is found on another with the same
    weights (components/studio/cards.py). Read it from the unedited model (not while an
    edit is applied)."""
    h = hashlib.blake2b(digest_size=16)
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // SAMPLED)
        h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|{_bit_sum(flat)}|".encode())
        h.update(flat[::step][:SAMPLED].float().cpu().numpy().tobytes())
    return h.hexdigest()


_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bit_sum(flat: torch.Tensor) -> int:
    """The sum of `flat`'s elements' bits read as integers of their size (in int64, where
    an overflow wraps: the same in any order of addition)."""
    as_int = _INTS.get(flat.element_size())
    if as_int is None or flat.dtype == torch.bool:
        return int(flat.to(torch.int64).sum().item())
    return int(flat.contiguous().view(as_int).sum(dtype=torch.int64).item())
