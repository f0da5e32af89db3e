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
    its sum in float64 and `SAMPLED` values spread over it (SmolLM2-135M: 0.2 s on a CPU).
    Read it from the unedited model (not while an edit is applied)."""
    h = hashlib.blake2b(digest_size=16)
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // SAMPLED)
        h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|{flat.double().sum().item():.17g}|".encode())
        h.update(flat[::step][:SAMPLED].float().cpu().numpy().tobytes())
    return h.hexdigest()
