"""Loading and saving GPT-2 checkpoints in Hugging Face's layout.

An HF GPT-2 folder holds ``config.json`` and the weights as ``model.safetensors``
(or the older ``pytorch_model.bin``, which we read only with
``torch.load(weights_only=True)``: a pickle can run code, weights_only cannot).
``from_pretrained`` looks for the folder

1. at ``name_or_path`` if it is a local folder;
2. in the HF hub cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
   ``~/.cache/huggingface/hub``), e.g. ``models--gpt2/snapshots/<rev>/``;
3. on the hub through ``huggingface_hub`` if it is installed and not offline.

The bundled pair is loaded by ``specref.models.pair.load_pair`` (no network).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors_bytes

from .gpt2 import GPT2, GPT2Config

__all__ = ["from_pretrained", "save_pretrained", "load_folder", "hub_cache_dir"]

# Short hub names and the organisation-prefixed names they now redirect to.
HUB_ALIASES: dict[str, tuple[str, ...]] = {
    "gpt2": ("gpt2", "openai-community/gpt2"),
    "gpt2-medium": ("gpt2-medium", "openai-community/gpt2-medium"),
    "gpt2-large": ("gpt2-large", "openai-community/gpt2-large"),
    "gpt2-xl": ("gpt2-xl", "openai-community/gpt2-xl"),
    "distilgpt2": ("distilgpt2", "distilbert/distilgpt2"),
}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def hub_cache_dir() -> Path:
    """The HF hub cache folder, honouring ``HF_HUB_CACHE`` and ``HF_HOME`` like ``huggingface_hub`` does."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def _has_weights(folder: Any) -> bool:
    return any(folder.joinpath(f).is_file() for f in WEIGHT_FILES)


def _find_in_cache(name: str) -> Path | None:
    cache = hub_cache_dir()
    for repo in HUB_ALIASES.get(name, (name,)):
        base = cache / ("models--" + repo.replace("/", "--"))
        snapshots = base / "snapshots"
        if not snapshots.is_dir():
            continue
        # Prefer the revision refs/main points at, then the most recent snapshot.
        ref = base / "refs" / "main"
        candidates = []
        if ref.is_file():
            candidates.append(snapshots / ref.read_text().strip())
        candidates += sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        for snap in candidates:
            if (snap / "config.json").is_file() and _has_weights(snap):
                return snap
    return None


def _download(name: str) -> Path | None:
    """Fetch config.json and the weights with huggingface_hub, if it is installed and we are online."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return None
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None
    repo = HUB_ALIASES.get(name, (name,))[-1]
    try:
        cfg = Path(hf_hub_download(repo, "config.json"))
        try:
            hf_hub_download(repo, "model.safetensors")
        except Exception:
            hf_hub_download(repo, "pytorch_model.bin")
        try:
            hf_hub_download(repo, "tokenizer.json")
        except Exception:
            pass
        return cfg.parent
    except Exception:
        return None


def _missing_error(name_or_path: str, where: str, missing: list[str]) -> FileNotFoundError:
    repo = HUB_ALIASES.get(name_or_path, (name_or_path,))[-1]
    return FileNotFoundError(
        f"cannot load GPT-2 {name_or_path!r}: missing {', '.join(missing)} in {where}. "
        f"A GPT-2 folder needs config.json and model.safetensors (or pytorch_model.bin). "
        f"Get them with:  huggingface-cli download {repo} config.json model.safetensors tokenizer.json  "
        f"(they land in {hub_cache_dir()}), or pass a local folder that holds them."
    )


def _resolve(name_or_path: str | os.PathLike) -> Any:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        missing = [f for f in ("config.json",) if not (path / f).is_file()]
        if not _has_weights(path):
            missing.append("model.safetensors (or pytorch_model.bin)")
        if missing:
            raise _missing_error(str(name_or_path), str(path), missing)
        return path
    if path.exists():
        raise ValueError(f"name_or_path must be a folder or a hub name, got the file {path}")
    name = str(name_or_path)
    found = _find_in_cache(name) or _download(name)
    if found is None:
        raise _missing_error(name, f"the HF cache {hub_cache_dir()} (and no download was possible)",
                             ["config.json", "model.safetensors (or pytorch_model.bin)"])
    return found


def _read_state_dict(folder: Any) -> dict[str, torch.Tensor]:
    """Weights of an HF folder (a Path or an importlib.resources Traversable)."""
    if folder.joinpath("model.safetensors").is_file():
        return load_safetensors_bytes(folder.joinpath("model.safetensors").read_bytes())
    if folder.joinpath("model.safetensors.index.json").is_file():
        index = json.loads(folder.joinpath("model.safetensors.index.json").read_text())
        sd: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            sd.update(load_safetensors_bytes(folder.joinpath(shard).read_bytes()))
        return sd
    if folder.joinpath("pytorch_model.bin").is_file():
        if not isinstance(folder, Path):
            raise ValueError("pytorch_model.bin is only read from a real folder")
        # weights_only=True: never unpickle arbitrary objects from a downloaded file.
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {folder}")


def load_folder(folder: Any, device: torch.device | str | None, dtype: torch.dtype | None) -> GPT2:
    config = GPT2Config.from_dict(json.loads(folder.joinpath("config.json").read_text()))
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: leave the caller's global RNG alone
        model = GPT2(config)
    sd = _read_state_dict(folder)
    # Checkpoints are often stored in fp16; compute in fp32 unless asked otherwise.
    model.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()})
    return model.to(device=device or "cpu", dtype=dtype or torch.float32).eval()


def from_pretrained(
    name_or_path: str | os.PathLike,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> GPT2:
    """A ``GPT2`` in eval mode from an HF-layout folder or hub name (``gpt2``, ``distilgpt2``, ...).

    Default ``device`` is CPU and ``dtype`` float32.  Raises ``FileNotFoundError``
    naming the missing files and the command that fetches them.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path must be a str or path, got {type(name_or_path).__name__}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return load_folder(_resolve(name_or_path), device, dtype)


def save_pretrained(model: GPT2, folder: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (HF layout; the tied ``lm_head`` is omitted as HF does)."""
    from safetensors.torch import save_file

    if not isinstance(model, GPT2):
        raise TypeError(f"model must be a GPT2, got {type(model).__name__}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype or v.dtype).contiguous().clone()
          for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
