"""Loading and saving GPT-2 checkpoints in Hugging Face's layout, the GPU timing pair and the GPT-2 family pair.

An HF GPT-2 folder holds ``config.json``, the weights as ``model.safetensors`` (or shards
listed in ``model.safetensors.index.json``, or the older ``pytorch_model.bin``, read only with
``torch.load(weights_only=True)``: a pickle can run code, weights_only cannot) and usually
``tokenizer.json``.  ``from_pretrained`` looks for the folder

1. at ``name_or_path`` if it is a local folder;
2. in the HF hub cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
   ``~/.cache/huggingface/hub``), e.g. ``models--gpt2/snapshots/<rev>/``;
3. on the hub through ``huggingface_hub``, only when the caller passes ``download=True``.

The rule of loading: the model is built on the meta device (no memory, no random init) and
each tensor is read from the memory-mapped file, cast to the target dtype, moved to the target
device and assigned, one at a time; the peak memory is the model in its dtype plus one tensor.

The bundled pair is loaded by ``specref.models.pair.load_pair`` (no network).
``timing_pair`` gives the pair the size the chapter talks about (GPT-2 XL and GPT-2) for
timing passes on a GPU, or models of their shapes with random weights when the weights are
not on this machine: a pass costs the same whatever the weights.
``gpt2_family_pair`` gives the real GPT-2 family as a (target, draft, tokenizer) pair for the
decoding functions (gpt2-medium, -large or -xl as the target, gpt2 or distilgpt2 as the draft)
when the learner has the weights: from the HF cache or a named folder only, downloading the
missing models only when asked (``download=True``).
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shlex
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import safe_open

from .gpt2 import GPT2, GPT2Config
from .tokenizer import BPETokenizer, load_tokenizer

__all__ = ["GPT2_FAMILY", "TIMING_CONFIGS", "FamilyPair", "TimingPair", "from_pretrained", "gpt2_family_pair",
           "hub_cache_dir", "load_folder", "pretrained_tokenizer", "random_gpt2", "save_pretrained", "timing_pair"]

# Short hub names and the organisation-prefixed names they now redirect to.
HUB_ALIASES: dict[str, tuple[str, ...]] = {
    "gpt2": ("gpt2", "openai-community/gpt2"),
    "gpt2-medium": ("gpt2-medium", "openai-community/gpt2-medium"),
    "gpt2-large": ("gpt2-large", "openai-community/gpt2-large"),
    "gpt2-xl": ("gpt2-xl", "openai-community/gpt2-xl"),
    "distilgpt2": ("distilgpt2", "distilbert/distilgpt2"),
}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER_FILE = "tokenizer.json"

# The shapes of the timing pair: GPT-2 XL (1.56 B parameters) and GPT-2 (124 M), as on the hub.
TIMING_CONFIGS: dict[str, GPT2Config] = {
    "gpt2-xl": GPT2Config(n_embd=1600, n_layer=48, n_head=25, bos_token_id=50256, eos_token_id=50256),
    "gpt2": GPT2Config(n_embd=768, n_layer=12, n_head=12, bos_token_id=50256, eos_token_id=50256),
}


def hub_cache_dir() -> Path:
    """The HF hub cache folder, honouring ``HF_HUB_CACHE`` and ``HF_HOME`` like ``huggingface_hub`` does."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def _has_weights(folder: Any) -> bool:
    return any(folder.joinpath(f).is_file() for f in WEIGHT_FILES)


def _missing_files(folder: Any, tokenizer: bool = False) -> list[str]:
    missing = [] if folder.joinpath("config.json").is_file() else ["config.json"]
    if not _has_weights(folder):
        missing.append("model.safetensors (or pytorch_model.bin)")
    if tokenizer and not folder.joinpath(TOKENIZER_FILE).is_file():
        missing.append(TOKENIZER_FILE)
    return missing


def _cache_repos(name: str, cache: Path) -> list[Path]:
    """The folders ``models--<org>--<name>`` that may hold ``name`` in the HF-cache-layout folder ``cache``."""
    return [cache / ("models--" + repo.replace("/", "--")) for repo in HUB_ALIASES.get(name, (name,))]


def _find_in_cache(name: str, cache: Path | None = None) -> Path | None:
    """The newest snapshot of ``name`` in the HF cache (or the cache-layout folder ``cache``) that holds
    config.json and weights."""
    for base in _cache_repos(name, hub_cache_dir() if cache is None else cache):
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
            if snap.is_dir() and not _missing_files(snap):
                return snap
    return None


def _hub_download() -> Any:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as err:
        raise ImportError("download=True needs the huggingface_hub package (pip install huggingface_hub)") from err
    return hf_hub_download


def _download(name: str, cache: Path | None = None) -> Path:
    """Fetch config.json, the weights and tokenizer.json with ``huggingface_hub`` (the caller asked for it).

    They land in the HF cache, or in the cache-layout folder ``cache`` when one is given.
    """
    hf_hub_download = _hub_download()
    where = {} if cache is None else {"cache_dir": str(cache)}
    repo = HUB_ALIASES.get(name, (name,))[-1]
    cfg = Path(hf_hub_download(repo, "config.json", **where))
    try:
        hf_hub_download(repo, "model.safetensors", **where)
    except Exception:  # older repositories hold only the pickle
        hf_hub_download(repo, "pytorch_model.bin", **where)
    try:
        hf_hub_download(repo, TOKENIZER_FILE, **where)
    except Exception:  # the model loads without it; pretrained_tokenizer names it if it is asked for
        pass
    return cfg.parent


def _missing_error(name_or_path: str, where: str, missing: list[str]) -> FileNotFoundError:
    repo = HUB_ALIASES.get(name_or_path, (name_or_path,))[-1]
    return FileNotFoundError(
        f"cannot load GPT-2 {name_or_path!r}: missing {', '.join(missing)} in {where}. "
        f"A GPT-2 folder needs config.json and model.safetensors (or pytorch_model.bin), and tokenizer.json "
        f"for text. Get them with:  hf download {repo} config.json model.safetensors tokenizer.json  "
        f"(huggingface_hub before 0.34: huggingface-cli download ...; they land in {hub_cache_dir()}), "
        f"pass download=True, or pass a local folder that holds them."
    )


def _resolve(name_or_path: str | os.PathLike, download: bool, tokenizer: bool = False) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        missing = _missing_files(path, tokenizer)
        if missing:
            raise _missing_error(str(name_or_path), str(path), missing)
        return path
    if path.exists():
        raise ValueError(f"name_or_path must be a folder or a hub name, got the file {path}")
    name = str(name_or_path)
    found = _find_in_cache(name)
    if found is None and download:
        found = _download(name)
    if found is None:
        raise _missing_error(name, f"the HF cache {hub_cache_dir()} (nothing is downloaded unless download=True)",
                             _missing_files(path, tokenizer))
    missing = _missing_files(found, tokenizer)
    if missing:
        raise _missing_error(name, str(found), missing)
    return found


def _check_options(device: Any, dtype: Any, download: Any) -> None:
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if device is not None and not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    if not isinstance(download, bool):
        raise TypeError(f"download must be a bool, got {type(download).__name__}")


def _tensors(folder: Any, stack: ExitStack) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of an HF folder's weights, one at a time, read from memory-mapped files."""
    if folder.joinpath("model.safetensors").is_file():
        shards = ["model.safetensors"]
    elif folder.joinpath("model.safetensors.index.json").is_file():
        index = json.loads(folder.joinpath("model.safetensors.index.json").read_text())
        shards = sorted(set(index["weight_map"].values()))
        absent = [s for s in shards if not folder.joinpath(s).is_file()]
        if absent:
            raise FileNotFoundError(f"the shard(s) {', '.join(absent)} listed in model.safetensors.index.json "
                                    f"are missing in {folder}")
    elif folder.joinpath("pytorch_model.bin").is_file():
        path = stack.enter_context(importlib.resources.as_file(folder.joinpath("pytorch_model.bin")))
        # weights_only=True: never unpickle arbitrary objects; mmap=True: never read the whole file at once.
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (pre-zip) format cannot be memory-mapped
            sd = torch.load(path, map_location="cpu", weights_only=True)
        yield from sd.items()
        return
    else:
        raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {folder}")
    for shard in shards:
        path = stack.enter_context(importlib.resources.as_file(folder.joinpath(shard)))
        with safe_open(str(path), framework="pt", device="cpu") as f:  # memory-mapped: a tensor is read when asked
            for name in f.keys():  # noqa: SIM118 - a safe_open handle is not a dict
                yield name, f.get_tensor(name)


def _on_meta(config: GPT2Config) -> GPT2:
    with torch.device("meta"):  # parameters without storage: nothing is allocated or initialised
        return GPT2(config)


def _assign(model: GPT2, state_dict: dict[str, torch.Tensor]) -> GPT2:
    model.load_state_dict(state_dict, assign=True)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"these tensors were not loaded: {', '.join(left)}")
    return model.eval()


def load_folder(folder: Any, device: torch.device | str | None, dtype: torch.dtype | None) -> GPT2:
    """A ``GPT2`` from an HF-layout folder (a Path or an importlib.resources Traversable), see the module rule."""
    config = GPT2Config.from_dict(json.loads(folder.joinpath("config.json").read_text()))
    device, dtype = torch.device(device or "cpu"), dtype or torch.float32  # fp16 checkpoints compute in fp32
    model = _on_meta(config)
    with ExitStack() as stack, torch.no_grad():
        # copy=True: the model never keeps a view of the mapped file
        sd = {name: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype, copy=True)
              for name, t in _tensors(folder, stack)}
    return _assign(model, sd)


def from_pretrained(
    name_or_path: str | os.PathLike,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    download: bool = False,
) -> GPT2:
    """A ``GPT2`` in eval mode from an HF-layout folder or hub name (``gpt2``, ``distilgpt2``, ...).

    Default ``device`` is CPU and ``dtype`` float32.  A hub name is looked up in the HF cache;
    it is downloaded only with ``download=True``.  Raises ``FileNotFoundError`` naming the
    missing files and the command that fetches them.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path must be a str or path, got {type(name_or_path).__name__}")
    _check_options(device, dtype, download)
    return load_folder(_resolve(name_or_path, download), device, dtype)


def pretrained_tokenizer(name_or_path: str | os.PathLike, *, download: bool = False) -> BPETokenizer:
    """The ``tokenizer.json`` of an HF-layout folder or cached hub model (``FileNotFoundError`` naming it if absent)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path must be a str or path, got {type(name_or_path).__name__}")
    _check_options(None, None, download)
    return load_tokenizer(_resolve(name_or_path, download, tokenizer=True) / TOKENIZER_FILE)


def random_gpt2(config: GPT2Config, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> GPT2:
    """A ``GPT2`` of ``config``'s shapes with random weights, made directly in ``dtype`` on ``device``.

    Weights are N(0, 0.02) from a generator seeded with ``seed`` (on ``device``), layer norms
    1 and biases 0: enough to time a pass, which costs the same whatever the weights.
    """
    if not isinstance(config, GPT2Config):
        raise TypeError(f"config must be a GPT2Config, got {type(config).__name__}")
    if device is None or dtype is None:
        raise TypeError("random_gpt2 needs a device and a dtype")
    _check_options(device, dtype, False)
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    model = _on_meta(config)
    sd: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:  # tied to wte: load_state_dict ties it again
            continue
        x = torch.empty(t.shape, device=device, dtype=dtype)
        if name.endswith("bias"):
            x.zero_()
        elif ".ln_" in name:
            x.fill_(1.0)
        else:
            x.normal_(0.0, config.initializer_range, generator=gen)
        sd[name] = x
    return _assign(model, sd)


class TimingPair(NamedTuple):
    """A target and a draft the size the chapter talks about, for timing passes."""

    target: GPT2
    draft: GPT2
    tokenizer: BPETokenizer | None  # None when the weights are random
    source: str  # one sentence: where the weights came from


def _timing_folders(folder: str | os.PathLike | None) -> tuple[Path, Path] | str:
    """The (gpt2-xl, gpt2) folders with config, weights and tokenizer, or why the cache has none."""
    if folder is not None:
        root = Path(folder).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"folder {str(root)!r} does not exist; it must hold gpt2-xl/ and gpt2/ subfolders")
        found = []
        for name in ("gpt2-xl", "gpt2"):
            sub = root / name
            if not sub.is_dir():
                raise FileNotFoundError(f"folder {str(root)!r} has no {name}/ subfolder (it must hold gpt2-xl/ and gpt2/)")
            missing = _missing_files(sub, tokenizer=True)
            if missing:
                raise _missing_error(name, str(sub), missing)
            found.append(sub)
        return found[0], found[1]
    snaps = {name: _find_in_cache(name) for name in ("gpt2-xl", "gpt2")}
    absent = [name for name, snap in snaps.items() if snap is None]
    if absent:
        return f"{' and '.join(absent)} {'is' if len(absent) == 1 else 'are'} not in the Hugging Face cache"
    xl, small = snaps["gpt2-xl"], snaps["gpt2"]
    assert xl is not None and small is not None
    if not (xl / TOKENIZER_FILE).is_file() and not (small / TOKENIZER_FILE).is_file():
        return f"the cached gpt2-xl and gpt2 have no {TOKENIZER_FILE}"
    return xl, small


def timing_pair(device: torch.device | str, dtype: torch.dtype = torch.bfloat16,
                folder: str | os.PathLike | None = None) -> TimingPair:
    """GPT-2 XL (target) and GPT-2 (draft) in ``dtype`` on ``device``, for timing passes.

    With ``folder`` (holding ``gpt2-xl/`` and ``gpt2/`` HF folders) the weights are loaded from it and
    a missing file is an error naming it.  Without, they come from the HF cache when both are there;
    otherwise both models get random weights of the same shapes (and ``tokenizer`` is None).
    Nothing is downloaded.  ``source`` says in one sentence which of these happened (naming no
    path of this machine unless ``folder`` was given, so a notebook can print it).
    """
    if device is None:
        raise TypeError("device must be a str or torch.device, got None")
    _check_options(device, dtype, False)
    if folder is not None and not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be None, a str or a path, got {type(folder).__name__}")
    found = _timing_folders(folder)
    if isinstance(found, str):
        target = random_gpt2(TIMING_CONFIGS["gpt2-xl"], device, dtype, seed=0)
        draft = random_gpt2(TIMING_CONFIGS["gpt2"], device, dtype, seed=1)
        source = (f"GPT-2 XL and GPT-2 shapes with random weights ({found}): a pass costs the same whatever "
                  f"the weights, so the timings hold, but the tokens they produce mean nothing.")
        return TimingPair(target, draft, None, source)
    xl, small = found
    target = load_folder(xl, device, dtype)
    draft = load_folder(small, device, dtype)
    tokenizer = load_tokenizer(xl / TOKENIZER_FILE if (xl / TOKENIZER_FILE).is_file() else small / TOKENIZER_FILE)
    where = f"the folder {folder}" if folder is not None else "the Hugging Face cache"
    return TimingPair(target, draft, tokenizer, f"GPT-2 XL and GPT-2 with their trained weights from {where}.")


def save_pretrained(model: GPT2, folder: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (HF layout; a tied ``lm_head`` is omitted as HF does)."""
    from safetensors.torch import save_file

    if not isinstance(model, GPT2):
        raise TypeError(f"model must be a GPT2, got {type(model).__name__}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype or v.dtype).contiguous().clone()
          for k, v in model.state_dict().items() if k != "lm_head.weight" or not model.config.tie_word_embeddings}
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")


# -- the real GPT-2 family, when the learner has its weights -----------------------------------------

# The GPT-2 family on the hub, smallest first: (parameters, size of its float32 model.safetensors).
GPT2_FAMILY: dict[str, tuple[str, str]] = {
    "distilgpt2": ("82 M", "about 353 MB"),
    "gpt2": ("124 M", "about 548 MB"),
    "gpt2-medium": ("355 M", "about 1.5 GB"),
    "gpt2-large": ("774 M", "about 3.3 GB"),
    "gpt2-xl": ("1.56 B", "about 6.4 GB"),
}
FAMILY_TARGETS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
FAMILY_DRAFTS = ("distilgpt2", "gpt2")


class FamilyPair(NamedTuple):
    """A GPT-2 family target, a smaller draft of the same family, and the one tokenizer they share."""

    target: GPT2
    draft: GPT2
    tokenizer: BPETokenizer


def _family_name(role: str, name: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{role} must be a str, one of {', '.join(allowed)}; got {type(name).__name__}")
    if name not in allowed:
        raise ValueError(f"{role} must be one of {', '.join(allowed)}, got {name!r}")
    return name


def _partial_snapshot(name: str, cache: Path) -> str | None:
    """What the first incomplete snapshot of ``name`` in ``cache`` lacks (an interrupted download), if any."""
    for base in _cache_repos(name, cache):
        snapshots = base / "snapshots"
        for snap in sorted(snapshots.iterdir()) if snapshots.is_dir() else []:
            missing = _missing_files(snap) if snap.is_dir() else []
            if missing:
                return f"the snapshot {snap} lacks {', '.join(missing)}; was a download interrupted?"
    return None


def _locate_family(name: str, root: Path | None) -> tuple[Path | None, str]:
    """The HF-layout folder holding ``name``'s config and weights, or None and what is missing where.

    Without ``root``: the newest complete snapshot in the HF cache.  With ``root``: ``root/<name>/``,
    else a snapshot in ``root`` read as a cache (``root/models--<org>--<name>/snapshots/<rev>/``).
    """
    if root is None:
        found = _find_in_cache(name)
        if found is not None:
            return found, ""
        return None, _partial_snapshot(name, hub_cache_dir()) or f"not in the Hugging Face cache {hub_cache_dir()}"
    sub = root / name
    if sub.is_dir() and not _missing_files(sub):
        return sub, ""
    found = _find_in_cache(name, root)
    if found is not None:
        return found, ""
    if sub.is_dir():
        return None, f"{sub} lacks {', '.join(_missing_files(sub))}"
    repos = " or ".join(f"{base.name}/snapshots/<rev>/" for base in _cache_repos(name, root))
    return None, _partial_snapshot(name, root) or f"the folder {root} holds neither {name}/ nor {repos}"


def _family_missing_error(target: str, draft: str, missing: dict[str, tuple[str, str]],
                          root: Path | None) -> FileNotFoundError:
    """Which models are absent, where they were looked for, and the commands that fetch them."""
    lines = [f"gpt2_family_pair(target={target!r}, draft={draft!r}) needs weights this machine does not have "
             f"(nothing is downloaded unless download=True):"]
    for role, (name, why) in missing.items():
        params, size = GPT2_FAMILY[name]
        lines.append(f"  {role} {name} ({params} parameters, {size}): {why}")
    into = f" --cache-dir {shlex.quote(str(root))}" if root is not None else ""
    lines.append(f"Get them with the Hugging Face CLI (they land in {root if root is not None else hub_cache_dir()}):")
    lines += [f"  hf download {HUB_ALIASES[name][-1]} config.json model.safetensors {TOKENIZER_FILE}{into}"
              for name, _ in missing.values()]
    lines.append("(huggingface_hub before 0.34 names the command huggingface-cli download), or call "
                 "gpt2_family_pair(..., download=True), which fetches the same files"
                 + (f" into {root}" if root is not None else "") + ".")
    if root is not None:
        lines.append(f"A model may also be an HF-layout folder {root}/<name>/ (config.json, model.safetensors, "
                     f"{TOKENIZER_FILE}).")
    return FileNotFoundError("\n".join(lines))


def _family_tokenizer(folders: dict[str, Path], vocab_size: int, target: str, root: Path | None,
                      download: bool) -> BPETokenizer:
    """The pair's tokenizer: the ``tokenizer.json`` beside the target's or the draft's weights (both: identical)."""
    files = {role: f / TOKENIZER_FILE for role, f in folders.items() if (f / TOKENIZER_FILE).is_file()}
    if not files and download:
        where = {} if root is None else {"cache_dir": str(root)}
        files["target"] = Path(_hub_download()(HUB_ALIASES[target][-1], TOKENIZER_FILE, **where))
    if not files:
        into = f" --cache-dir {shlex.quote(str(root))}" if root is not None else ""
        raise FileNotFoundError(
            f"tokenizer: neither {folders['target']} nor {folders['draft']} holds {TOKENIZER_FILE}, the family's "
            f"tokenizer. Get it with:  hf download {HUB_ALIASES[target][-1]} {TOKENIZER_FILE}{into}  "
            f"or call gpt2_family_pair(..., download=True).")
    toks = {role: load_tokenizer(f) for role, f in files.items()}
    if len(toks) == 2 and toks["target"].tok.get_vocab() != toks["draft"].tok.get_vocab():
        raise ValueError(f"tokenizer: the target's {files['target']} and the draft's {files['draft']} map "
                         f"tokens to different ids; a draft must share the target's tokenizer")
    tok = next(iter(toks.values()))
    if tok.vocab_size > vocab_size:
        raise ValueError(f"tokenizer: {next(iter(files.values()))} has {tok.vocab_size} tokens but the models "
                         f"score only {vocab_size}; it is not these models' tokenizer")
    return tok


def gpt2_family_pair(
    target: str = "gpt2-medium",
    draft: str = "gpt2",
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    download: bool = False,
    folder: str | os.PathLike | None = None,
) -> FamilyPair:
    """The real GPT-2 family as a (target, draft, tokenizer) pair for specref's decoding functions.

    ``target`` is one of ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl`` (or ``gpt2``), ``draft`` one of
    ``gpt2``, ``distilgpt2``, and the draft must be the smaller; both share GPT-2's 50257-token
    tokenizer.  Default ``device`` is the CPU and ``dtype`` float32 (``torch.bfloat16`` halves the
    memory on a GPU).  The rule of where weights come from:

    - without ``folder``, only the Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
      ``~/.cache/huggingface/hub``);
    - with ``folder``, only that folder: ``folder/<name>/`` as an HF-layout folder, or ``folder`` read
      as a cache (``folder/models--<org>--<name>/snapshots/<rev>/``, what ``hf download --cache-dir``
      writes);
    - nothing is downloaded unless ``download=True``; then only the missing models, with
      ``huggingface_hub``, into the cache or ``folder``.

    A model that is absent raises ``FileNotFoundError`` listing each missing model, where it was
    looked for, its size and the command that fetches it.  Names, vocabularies and tokenizers are
    checked before any weights are read: an unknown name, a draft not smaller than the target,
    vocabularies of different sizes or two ``tokenizer.json`` with different ids raise ``ValueError``
    naming the argument; a wrong type raises ``TypeError``.
    """
    target = _family_name("target", target, FAMILY_TARGETS)
    draft = _family_name("draft", draft, FAMILY_DRAFTS)
    order = list(GPT2_FAMILY)
    if order.index(draft) >= order.index(target):
        raise ValueError(f"draft must be smaller than the target: {draft!r} is not smaller than {target!r} "
                         f"(the family, smallest first: {', '.join(order)})")
    _check_options(device, dtype, download)
    if device is not None and torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device is {device!r} but torch sees no CUDA device here; leave device=None for the CPU")
    if folder is not None and not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be None, a str or a path, got {type(folder).__name__}")
    root = None if folder is None else Path(folder).expanduser()
    if root is not None and not root.is_dir():
        if root.exists() or not download:
            raise FileNotFoundError(f"folder {str(root)!r} is not a folder; it must hold {target}/ and {draft}/ "
                                    f"HF-layout folders or an HF cache (or pass download=True to fetch them into it)")
        root.mkdir(parents=True)

    folders: dict[str, Path] = {}
    missing: dict[str, tuple[str, str]] = {}
    for role, name in (("target", target), ("draft", draft)):
        path, why = _locate_family(name, root)
        if path is None and download:
            got = _download(name, root)
            path, why = (got, "") if not _missing_files(got) else _locate_family(name, root)
        if path is None:
            missing[role] = (name, why)
        else:
            folders[role] = path
    if missing:
        raise _family_missing_error(target, draft, missing, root)

    configs = {role: GPT2Config.from_dict(json.loads((f / "config.json").read_text())) for role, f in folders.items()}
    vocab = configs["target"].vocab_size
    if configs["draft"].vocab_size != vocab:
        raise ValueError(f"draft: {draft} in {folders['draft']} scores {configs['draft'].vocab_size} tokens but the "
                         f"target {target} in {folders['target']} scores {vocab}; a draft must share the "
                         f"target's vocabulary")
    tokenizer = _family_tokenizer(folders, vocab, target, root, download)
    return FamilyPair(load_folder(folders["target"], device, dtype), load_folder(folders["draft"], device, dtype),
                      tokenizer)
