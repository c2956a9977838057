"""Turn `--model` (a local folder or a Hugging Face repo id) into a folder on disk."""

from __future__ import annotations

import os
from pathlib import Path

# The offline default: keel's own (lossy, Q4_1-dequantized) conversion of SmolLM2-135M-Instruct,
# installed by `keel models fetch-demo` into keel's cache, never into the Hugging Face cache.
KEEL_NAMESPACE = "keel"
DEFAULT_MODEL = f"{KEEL_NAMESPACE}/SmolLM2-135M-Instruct-Q4_1"

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


def keel_cache_dir() -> Path:
    """keel's own model cache (HF-style layout), read at call time: `KEEL_CACHE`, else ~/.cache/keel/hub."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "keel", "hub")
    return Path(os.environ.get("KEEL_CACHE") or default).expanduser()


def repo_folder(cache: Path, repo_id: str) -> Path:
    """The folder of `repo_id` in an HF-style cache: models--<org>--<name>."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def keel_snapshot(repo_id: str, revision: str | None = None, cache: Path | None = None) -> Path | None:
    """The snapshot folder of a keel-made model at `revision` (a ref such as main, or a commit), or None."""
    repo = repo_folder(cache or keel_cache_dir(), repo_id)
    rev = revision or "main"
    if "/" in rev or rev in ("", ".", ".."):
        return None
    ref = repo / "refs" / rev
    commit = ref.read_text().strip() if ref.is_file() else rev
    snapshot = repo / "snapshots" / commit
    return snapshot if (snapshot / "config.json").is_file() else None


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
    if model.startswith(f"{KEEL_NAMESPACE}/"):  # keel's own conversions: keel's cache, never the Hub
        return _resolve_keel(model, revision)
    from huggingface_hub import snapshot_download  # deferred: a local folder never pays its import

    cache = hub_cache_dir()
    offline = hub_offline()
    hint = ""
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


def _resolve_keel(model: str, revision: str | None) -> Path:
    snapshot = keel_snapshot(model, revision)
    if snapshot is None:
        rev = f" at revision {revision!r}" if revision else ""
        hint = "; run `keel models fetch-demo` to install it" if model == DEFAULT_MODEL else ""
        raise ModelNotFoundError(
            f"model {model!r}{rev} not found in keel's model cache {repo_folder(keel_cache_dir(), model)} "
            f"(KEEL_CACHE; ids under '{KEEL_NAMESPACE}/' are keel's own conversions, never fetched from the "
            f"Hugging Face Hub){hint}"
        )
    return snapshot
