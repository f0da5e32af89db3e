"""Where the bundled demo models live, and how to load them."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSETS_DIR = REPO_ROOT / "assets"
# `pip install .` puts the weights of assets/demo-* inside the package (pyproject.toml maps
# assets/ to grom.demo.models), so the demo loads outside the repository too
PACKAGED_DIR = Path(__file__).resolve().parent / "models"
MODEL_KINDS = ("full", "retain")


def demo_model_dir(kind: str = "full") -> Path:
    """The folder of the demo model `kind` ("full" or "retain"): inside the installed
    package, else the repository's assets/ (where `python -m grom.demo.train` writes)."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown demo model kind {kind!r}; use one of {', '.join(MODEL_KINDS)}")
    packaged = PACKAGED_DIR / f"demo-{kind}"
    return packaged if (packaged / "config.json").is_file() else ASSETS_DIR / f"demo-{kind}"


def load_demo_model(kind: str = "full", device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32):
    """Load the bundled demo model and its tokenizer: `(model, tokenizer)`, model in eval mode.

    "full" learned every non-holdout author; "retain" never saw the forget10 authors
    (the gold reference for unlearning). Raises FileNotFoundError if the assets are missing.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = demo_model_dir(kind)
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"demo model {kind!r} not found in {folder}: install the library "
                                "from the repository (`pip install .`, which packages "
                                "assets/demo-*), or build it with `python -m grom.demo.train`")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, use_safetensors=True)
    log.info("loaded demo model %s from %s", kind, folder)
    return model.to(device).eval(), tokenizer
