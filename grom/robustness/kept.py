"""The unedited model's side of the attack suite, kept on disk between runs.

Half of what the suite computes does not depend on the edit: the unedited model's answers to
every probe attack's questions, and the control of the relearning attack (the unedited model
fine-tuned the same way). Attacking a second edit of the same model on the same probes, as
one does when exploring settings, recomputes all of it. `UneditedSide` keeps those results
under a key made of everything they depend on: the weights (`weights_fingerprint`, read when
the suite starts), their dtype and device type, the tokenizer (its vocabulary and chat
template), the torch and transformers versions, `VERSION`, and the attack's own inputs
(questions, answers, facts, prompt format; the relearning's data and settings). What is read
back is what the same computation gave on this host before, up to the float rounding of the
batch it was computed in (the suite's own runs already answer several attacks' questions in
one batch).

Where: GROM_UNEDITED_DIR (default ``~/.cache/grom/unedited``); GROM_UNEDITED_DIR=off (or
``run_attacks(kept=None)``, ``python -m grom attack --fresh``) computes everything again.
One small JSON file per result; an unreadable file is computed again and written over.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from grom.model.fingerprint import weights_fingerprint
from grom.robustness.result import Recall

log = logging.getLogger(__name__)
VERSION = 1
"""Bumped when the unedited side's computation changes (its generation, its budgets, the
relearning): results kept by an older version are not read."""
MAX_BYTES = 16 << 20  # a kept file larger than this is not read


def unedited_root() -> Path | None:
    """GROM_UNEDITED_DIR, else ~/.cache/grom/unedited; None where it is "off" (or "0", "")."""
    raw = os.environ.get("GROM_UNEDITED_DIR")
    if raw is not None and raw.strip().lower() in ("", "0", "off", "no", "false"):
        return None
    return Path(raw.strip()) if raw else Path.home() / ".cache" / "grom" / "unedited"


def tokenizer_digest(tokenizer) -> str:
    """A digest of what turns a question into token ids: the vocabulary, the special tokens
    and the chat template."""
    h = hashlib.blake2b(digest_size=16)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    h.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    h.update(repr(getattr(tokenizer, "chat_template", None)).encode())
    h.update(repr(sorted((getattr(tokenizer, "special_tokens_map", None) or {}).items())).encode())
    return h.hexdigest()


class UneditedSide:
    """The unedited model's results for the attack suite, read from and written to `root`
    (module docstring). `stamp` is what every key holds besides the attack's inputs; `read`
    and `written` count this run's hits and new entries. Built from the model as found (the
    edit not applied); `fingerprint`: its `weights_fingerprint` where the caller has it
    already (an app that keeps it per model)."""

    def __init__(self, model: nn.Module, tokenizer, root: Path | None = None, fingerprint: str | None = None):
        import transformers

        self.root = Path(root) if root is not None else unedited_root()
        first = next(model.parameters(), None)
        self.stamp = {"version": VERSION, "weights": fingerprint or weights_fingerprint(model),
                      "dtype": str(first.dtype) if first is not None else "",
                      "device": first.device.type if first is not None else "",
                      "tokenizer": tokenizer_digest(tokenizer),
                      "torch": torch.__version__, "transformers": transformers.__version__}
        self.read = self.written = 0

    def _path(self, kind: str, what) -> Path:
        text = json.dumps([self.stamp, kind, what], sort_keys=True, ensure_ascii=False, default=repr)
        return self.root / kind / f"{hashlib.blake2b(text.encode(), digest_size=20).hexdigest()}.json"

    def holds(self, kind: str, what) -> bool:
        """Whether a result for `kind` on inputs `what` is on disk (not read: `recalls` may still
        find it unreadable and compute it again)."""
        if self.root is None:
            return False
        path = self._path(kind, what)
        return path.is_file() and not path.is_symlink()

    def recalls(self, kind: str, what) -> list[Recall] | None:
        """The recalls kept for `kind` on inputs `what` (JSON-able), else None."""
        if self.root is None:
            return None
        path = self._path(kind, what)
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_BYTES:
                return None
            rows = json.loads(path.read_text(encoding="utf-8"))["recalls"]
            out = [Recall(float(r["value"]), tuple(str(a) for a in r["answers"]), tuple(float(h) for h in r["hits"]))
                   for r in rows]
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.info("kept unedited result %s not read: %s", path.name, err)
            return None
        self.read += 1
        return out

    def keep(self, kind: str, what, recalls: Sequence[Recall]) -> None:
        """Write `recalls` for `kind` on inputs `what`; a failure to write is logged, not raised."""
        if self.root is None:
            return
        path = self._path(kind, what)
        doc = {"kind": kind, "stamp": self.stamp,
               "recalls": [{"value": r.value, "answers": list(r.answers), "hits": list(r.hits)} for r in recalls]}
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp",
                                             delete=False) as f:
                tmp = f.name
                json.dump(doc, f, ensure_ascii=False)
            os.replace(tmp, path)
        except OSError as err:
            log.warning("the unedited model's %s result was not kept in %s: %s", kind, self.root, err)
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            return
        self.written += 1
