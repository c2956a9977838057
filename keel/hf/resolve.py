"""Turn `--model` (a local folder or a Hugging Face repo id) into a folder on disk."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

# files a checkpoint needs; anything else in the repo is never fetched
_ALLOW = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model"]


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a local folder nor available from the Hugging Face cache or hub."""


def hub_cache_dir() -> Path:
    """The HF hub cache, read from the environment at call time (`HF_HUB_CACHE`, `HF_HOME`)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """True when `HF_HUB_OFFLINE` is set to a true value."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _looks_like_repo_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) <= 2 and all(parts) and not model.startswith((".", "~")) and "\\" not in model


def resolve_model(model: str, revision: str | None = None) -> Path:
    """Return the folder holding `config.json` for a local path or a hub repo id (cache first)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but has no config.json; expected a Hugging Face checkpoint")
        return path
    if not _looks_like_repo_id(model):
        raise ModelNotFoundError(f"model folder {path} does not exist (and {model!r} is not a repo id like 'org/name')")
    from huggingface_hub import snapshot_download  # deferred: importing it costs ~0.3 s

    cache = hub_cache_dir()
    offline = hub_offline()
    hint = ""
    if model == DEFAULT_MODEL:
        hint = "; run `keel models fetch-demo` to install the offline demo model"
    try:
        folder = Path(
            snapshot_download(
                model, revision=revision, cache_dir=cache, local_files_only=offline, allow_patterns=_ALLOW
            )
        )
    except Exception as exc:  # huggingface_hub raises many types (offline, 404, network, validation)
        where = f"the Hugging Face cache {cache}" + ("" if offline else " and the hub")
        rev = f" at revision {revision!r}" if revision else ""
        raise ModelNotFoundError(
            f"model {model!r}{rev} not found: no local folder {path.resolve()} and not in {where} "
            f"({type(exc).__name__}){hint}"
        ) from exc
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{model!r} resolved to {folder}, which has no config.json{hint}")
    return folder
