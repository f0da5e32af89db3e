"""`EditConfig`: every setting of one GROM edit, frozen, with the paper's presets.

(Was `grom/config.py`.)
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from grom.closed_form.refusal import refusal_problem
from grom.data.encoding import KEY_MODES, KEY_POSITIONS, PROMPT_MODES
from grom.data.prompts import PromptFormat, settings_from_dict
from grom.model.arch import MATRIX_KINDS

TARGETS = ("suppression", "corruption", "refusal")
# The range of every numeric setting, one source of truth for the library, the CLI and the
# app's widgets and imports: (lowest, highest), both allowed. The upper bounds are far past
# what the paper uses (beta 20 to 1000, w_r 10 to 1000, rho 0.03, c 45) and only stop
# values that overflow or turn every answer into noise; seeds are numpy's (below 2**32).
BOUNDS: dict[str, tuple[float, float]] = {
    "beta": (0.0, 1e6), "w_r": (0.0, 1e9), "w_f": (1e-9, 1e9), "rho": (1e-6, 10.0), "c": (0.0, 1e6),
    "k": (1, 1024), "seed": (0, 2**32 - 1), "batch_size": (1, 1024), "max_length": (2, 1 << 20),
    "forget_budget": (1, 10**9), "retain_budget": (1, 10**9),
}
WHOLE = ("k", "seed", "batch_size", "max_length", "forget_budget", "retain_budget")


def out_of_bounds(name: str, value) -> str | None:
    """Why `value` cannot be the setting `name` (None: it can): not a number (a whole
    number for the counts), not finite, or outside BOUNDS."""
    lo, hi = BOUNDS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} must be a number (got {type(value).__name__})"
    if name in WHOLE and not (isinstance(value, int) or float(value).is_integer()):
        return f"{name} must be a whole number (got {value!r})"
    if not math.isfinite(float(value)):
        return f"{name} must be a finite number (got {value})"
    if not lo <= value <= hi:
        return f"{name} = {value:g} is out of range: use {lo:g} to {hi:g}"
    return None


@dataclass(frozen=True)
class EditConfig:
    """Settings of a GROM edit (symbols as in the paper)."""

    matrix: str = "down_proj"
    """Edited matrix kind: "down_proj" (MLP output), "o_proj" (attention output), "lm_head"."""
    layers: tuple[int, ...] | None = None
    """Layers to edit, in order; None picks the band of width `k` by the layer scores S_l."""
    k: int = 5
    """Width of the automatic band."""
    candidates: tuple[int, ...] | None = None
    """Layers the automatic band may use (None: all)."""
    target: str = "suppression"
    """"suppression" (push away from the gold tokens), "corruption" (toward c * u) or
    "refusal" (toward a refusal's tokens, keys teacher-forced on prompt + refusal:
    `grom.closed_form.refusal`; the band is still scored on the forget answers)."""
    beta: float = 65.0
    """Suppression strength (the refusal target's promotion strength too)."""
    beta_relative: bool = False
    """If True, beta is in units of the mean norm of the edited matrix's output on the
    forget keys (so one value transfers across model sizes); the paper's presets use
    absolute beta."""
    w_r: float = 100.0
    """Retain weight; only w_r / w_f matters."""
    w_f: float = 1.0
    """Forget weight (gauge: 1)."""
    rho: float = 0.03
    """Ridge: mu = rho * mean diagonal of the data part of A."""
    c: float = 45.0
    """Corruption strength (target "corruption")."""
    use_alpha: bool = True
    """Weight each forget token by its specificity alpha (off: the paper's ablation). The
    refusal target promotes every refusal token alike (alpha guards shared words against
    suppression, which promotion does not do); the band's scores still use it."""
    refusal: str | None = None
    """Target "refusal": the one answer every forget question is taught (None: one of
    `grom.closed_form.refusal.REFUSALS` per question, drawn with `seed`)."""
    forget_budget: int | None = 20000
    """At most this many forget key columns (seeded subsample); None: all."""
    retain_budget: int | None = 40000
    """At most this many retain key columns; None: all."""
    key_mode: str = "auto"
    """Forget keys (`grom.data.encoding.KEY_MODES`): "auto" (by example type), "qa" (the answer
    tokens, the paper's), "corpus", "subject_last", or in the prompt: "subject", "last_prompt",
    "prompt", "prompt_qa" (`KEY_POSITIONS` pairs them with retain modes)."""
    retain_key_mode: str = "auto"
    """Retain keys, the same choices (ZsRE: subject_last forget keys, QA retain keys)."""
    prompt_format: PromptFormat | None = None
    """How questions become prompts (None: the tokenizer's chat template, else Question/Answer)."""
    max_length: int = 512
    """Longest tokenized sequence (corpus texts are cut into windows of this length)."""
    seed: int = 0
    """Seed of the subsampling and of the corruption direction."""
    batch_size: int = 16
    """Sequences per forward pass."""
    stream: bool = True
    """Run the model once up to the band and advance the hidden states layer by layer
    (False: a full forward pass per edited layer, the slower reference path)."""
    keep_keys: bool = False
    """Keep the keys (float32, on the CPU) for the diagnostics (influence audit, outputs);
    off, memory does not grow with the number of keys (the system is summed batch by batch)."""

    def __post_init__(self) -> None:
        problems = [out_of_bounds(name, getattr(self, name)) for name in BOUNDS
                    if getattr(self, name) is not None or name not in ("forget_budget", "retain_budget")]
        check = [
            (self.matrix in MATRIX_KINDS, f"matrix must be one of {', '.join(MATRIX_KINDS)}"),
            (self.target in TARGETS, f"target must be one of {', '.join(TARGETS)}"),
            (self.target != "refusal" or self.key_mode in ("auto", "qa", *PROMPT_MODES),
             f"the refusal target takes its keys after each forget question or in its prompt (key_mode auto, "
             f"qa, {', '.join(PROMPT_MODES)}), not {self.key_mode!r}"),
            (self.key_mode in KEY_MODES and self.retain_key_mode in KEY_MODES,
             f"key modes must be one of {', '.join(KEY_MODES)}"),
            (self.layers is None or (len(self.layers) > 0 and all(
                isinstance(l, int) and not isinstance(l, bool) and 0 <= l < 100_000 for l in self.layers)),
             "layers must be None or a non-empty list of layer numbers"),
        ]
        problems += [msg for ok, msg in check if not ok]
        problems.append(self.refusal is not None and refusal_problem(self.refusal))
        problems = [p for p in problems if p]
        if problems:
            raise ValueError(f"EditConfig: {problems[0]}")
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(l) for l in self.layers))
        if isinstance(self.prompt_format, dict):
            object.__setattr__(self, "prompt_format", PromptFormat(**self.prompt_format))

    def replace(self, **changes) -> "EditConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EditConfig":
        return settings_from_dict(cls, d, tuples=("layers", "candidates"))


def keyed_at(config: EditConfig, where: str) -> EditConfig:
    """`config` with its forget keys at `where` (a name of `KEY_POSITIONS`: "answer", the
    paper's, "subject", "last_prompt" or "prompt") and its retain keys to match."""
    if where not in KEY_POSITIONS:
        raise ValueError(f"key positions {where!r} are unknown; use one of {', '.join(KEY_POSITIONS)}")
    forget, retain = KEY_POSITIONS[where]
    return config.replace(key_mode=forget, retain_key_mode=retain)


def key_positions_of(config: EditConfig) -> str | None:
    """The `KEY_POSITIONS` name of `config`'s key modes (the answer's for "qa" as for "auto");
    None where they are another pair (ZsRE's subject_last keys, a corpus)."""
    modes = tuple("auto" if m == "qa" else m for m in (config.key_mode, config.retain_key_mode))
    return next((name for name, pair in KEY_POSITIONS.items() if pair == modes), None)


def _band(a: int, b: int) -> tuple[int, ...]:
    return tuple(range(a, b + 1))


_DEMO = EditConfig(layers=(3, 4, 5), beta=150.0, beta_relative=True, w_r=100.0, rho=0.03, batch_size=32)
PRESETS: dict[str, EditConfig] = {
    "tofu10": EditConfig(layers=_band(11, 15), beta=65.0, w_r=100.0, rho=0.03),
    "tofu5": EditConfig(layers=_band(26, 31), beta=1000.0, w_r=300.0, rho=0.03),
    "muse-news": EditConfig(layers=_band(28, 31), beta=370.0, w_r=10.0, rho=0.03),
    "muse-books": EditConfig(layers=_band(28, 31), beta=350.0, w_r=80.0, rho=0.03),
    "wmdp-bio": EditConfig(layers=(8,), target="corruption", c=45.0, w_r=1000.0, rho=0.03),
    "zsre": EditConfig(matrix="lm_head", beta=20.0, w_r=30.0, rho=0.03, key_mode="subject_last"),
    # The bundled demo model (6 layers, width 128): beta is relative to the mean norm of
    # each layer's down_proj output on the forget keys; tuned on forget10 (BENCHMARKS.md:
    # forget fact recall 0.98 -> 0.46, retain 0.99 -> 0.96).
    "demo": _DEMO,
    # The smaller demo splits: the forget term is a mean over s keys (w_f / s), so with
    # fewer forget keys each one weighs more and w_r must grow about as 1/s to keep the
    # retain set (the forget10 preset on forget01 drops retain fact recall to 0.18).
    # Tuned on each split, 40 examples per set (BENCHMARKS.md).
    "demo-forget05": _DEMO.replace(w_r=200.0),
    "demo-forget01": _DEMO.replace(beta=200.0, w_r=1000.0),
    # SmolLM2-135M-Instruct (30 layers) on the real-knowledge benchmark: the paper's
    # TOFU-10% settings (absolute beta 65, w_r 100, rho 0.03) with the automatic band of 5.
    "smollm2": EditConfig(k=5, beta=65.0, w_r=100.0, rho=0.03),
    # The same model with its forget keys at every prompt token, each moved toward a refusal's
    # first token, the retain keys at every prompt and answer position (issue 47, BENCHMARKS.md
    # "Where GROM takes its keys"): at the smollm2 preset's retain cost or below it leaves half
    # the held-out facts (0.20 / 0.36 / 0.10 of the solar system's, WWII's, the human body's
    # known probes, against 0.53 / 0.43 / 0.40), and breaks more answers (0.33 / 0.14 / 0.20
    # of the held-out ones degenerate, against 0.07 / 0.07 / 0.10). Offered, not the default.
    "smollm2-prompt": EditConfig(k=5, beta=90.0, w_r=100.0, rho=0.03, target="refusal", key_mode="prompt",
                                 retain_key_mode="prompt_qa"),
}


def demo_preset(split: str) -> str:
    """The preset tuned for a split of the bundled demo world: demo-<split>, else demo."""
    return f"demo-{split}" if f"demo-{split}" in PRESETS else "demo"


def preset(name: str) -> EditConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]
