"""Bridge from setuptools to CMake + Ninja (see CMakeLists.txt and README "Building").

Environment options (all optional):
  KEEL_CUDA=on|off|auto    build keel/_C_cuda.abi3.so (auto: when nvcc is found)
  KEEL_CUDA_ARCHS="80;90"  CUDA architectures
  KEEL_TORCH_TARGET=2.10   oldest torch whose stable ABI the libraries may use
  MAX_JOBS=N               parallel compile jobs

Building a wheel also audits every native library it produced (every *.abi3.so under the
build output, vendored ones included) with keel-audit's strict policy against
KEEL_TORCH_TARGET (keel-audit must be installed: `pip install ./audit`), fails on any error,
and writes the audit's torch floor into the wheel's `torch>=` requirement.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
TORCH_TARGET = os.environ.get("KEEL_TORCH_TARGET", "2.10")


def torch_root() -> str:
    """The torch package directory of the building interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def tool(name: str) -> str:
    """`cmake` / `ninja` from the building environment (the PyPI packages), else from PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if not found:
        raise RuntimeError(f"keel: `{name}` not found; pip install -r requirements-build.txt")
    return found


def load_audit():
    """The installed keel-audit distribution (built from audit/; it imports neither torch nor keel)."""
    try:
        import keel_audit
    except ImportError:
        raise SystemExit(
            "keel: building the wheel needs keel-audit for its release gate; install it first: pip install ./audit"
        ) from None
    return keel_audit


class CMakeBuild(build_ext):
    """Configures and builds the whole CMake project once, into the extensions' directory."""

    def run(self) -> None:
        out_dir = Path(self.get_ext_fullpath("keel._C")).resolve().parent
        out_dir.mkdir(parents=True, exist_ok=True)
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            tool("cmake"),
            "-S",
            str(ROOT),
            "-B",
            str(build_dir),
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DTORCH_ROOT={torch_root()}",
            f"-DKEEL_CUDA={os.environ.get('KEEL_CUDA', 'auto')}",
            f"-DKEEL_CUDA_ARCHS={os.environ.get('KEEL_CUDA_ARCHS', '80;90')}",
            f"-DKEEL_TORCH_TARGET={TORCH_TARGET}",
        ]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.run([tool("cmake"), "--build", str(build_dir), "-j", jobs], check=True)
        self.built_libraries = sorted(out_dir.rglob("*.abi3.so"))  # vendored libraries sit in subfolders
        if not self.built_libraries:
            raise RuntimeError(f"keel: the CMake build produced no *.abi3.so in {out_dir}")


class AuditedWheel(bdist_wheel):
    """abi3 wheel (cp310) whose native libraries pass keel's audit before packaging."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.py_limited_api = "cp310"

    def run(self) -> None:
        self.run_command("build_ext")
        libs = self.get_finalized_command("build_ext").built_libraries  # every *.abi3.so, vendored too
        audit = load_audit()
        result = audit.audit([str(p) for p in libs], target_torch=TORCH_TARGET, strict=True)
        print(result.render())
        if not result or not result.torch_floor:
            raise SystemExit(
                f"keel: audit of {', '.join(p.name for p in libs)} failed "
                f"(target torch {TORCH_TARGET}); wheel not built"
            )
        self.torch_requirement = f"torch>={result.torch_floor}"
        self.manylinux_floor = result.manylinux_floor  # the platform tag (get_tag) follows the audit
        super().run()

    def get_tag(self) -> tuple[str, str, str]:
        # linux_<arch> -> manylinux_<X>_<Y>_<arch>: the audit's manylinux floor, the oldest manylinux
        # policy whose GLIBC_/GLIBCXX_/CXXABI_/GCC_ bounds admit every library (`auditwheel show`
        # computes the same); it stays linux_<arch> when the audit knows no policy that admits them.
        impl, abi, plat = super().get_tag()
        floor = getattr(self, "manylinux_floor", None)
        if floor and plat.startswith("linux_"):
            plat = f"manylinux_{floor.replace('.', '_')}_{plat.removeprefix('linux_')}"
        return impl, abi, plat

    def write_wheelfile(self, wheelfile_base: str, *args, **kwargs) -> None:
        # Called once the wheel's dist-info exists (however setuptools produced it): add the
        # audited torch requirement to its METADATA before the archive is written.
        super().write_wheelfile(wheelfile_base, *args, **kwargs)
        metadata = Path(wheelfile_base) / "METADATA"
        head, sep, body = metadata.read_text().partition("\n\n")
        lines = [ln for ln in head.splitlines() if not ln.startswith("Requires-Dist: torch")]
        lines.append(f"Requires-Dist: {self.torch_requirement}")
        metadata.write_text("\n".join(lines) + "\n" + sep.lstrip("\n") + ("\n" if sep else "") + body)


# What keel needs at run time besides torch (torch>= comes from the audit, above).
RUNTIME_REQUIRES = [
    "numpy",
    "safetensors>=0.4",
    "tokenizers>=0.19",
    "huggingface_hub>=0.23",
    "jinja2>=3.1",
    "tqdm",
    "fastapi>=0.115",
    "uvicorn>=0.30",  # `keel serve`
    "prometheus-client>=0.20",  # `keel serve` /metrics, with vLLM's metric names
    "llguidance>=1.9,<2",  # structured outputs (src/keel/structured): one abi3 wheel, no dependencies
]

setup(
    ext_modules=[Extension("keel._C", sources=[], py_limited_api=True)],
    cmdclass={"build_ext": CMakeBuild, "bdist_wheel": AuditedWheel},
    install_requires=RUNTIME_REQUIRES,
)
