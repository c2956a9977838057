"""Helpers of the audit's tests: tiny C/C++ shared objects compiled inside the tests, wheels built
from them, and where real ELF files of this machine are (torch's libraries, the interpreter's own
extension modules, system libraries).

pytest puts this folder on sys.path (`pythonpath` in audit/pyproject.toml, and in keel's pyproject.toml;
pytest runs in importlib mode, the tests are no package), so test modules `from audit_support import ...`
whether pytest runs from keel's root or from audit/.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

AUDIT_ROOT = Path(__file__).resolve().parents[1]  # audit/: the keel-audit project
SCRIPTS = AUDIT_ROOT / "scripts"  # its table generators, benchmarks and the mutation harness

SHIM = (
    "typedef int E; extern E aoti_torch_get_data_ptr(void*, void**);\n"
    "extern E torch_call_dispatcher(const char*, const char*, void*, unsigned long long);\n"
)
STABLE_BODY = 'void* p; aoti_torch_get_data_ptr(t, &p); return torch_call_dispatcher("a", "b", 0, 0);'

# name -> (language, source, extra linker args)
SOURCES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "stable": ("c", SHIM + f"int keel_stable(void* t) {{ {STABLE_BODY} }}\n", ()),
    "newer": (
        "c",
        SHIM + f"extern E torch_from_blob();\nint keel_newer(void* t) {{ torch_from_blob(); {STABLE_BODY} }}\n",
        (),
    ),
    "unknown": (
        "c",
        SHIM + f"extern E torch_frobnicate(void);\nint keel_unknown(void* t) {{ torch_frobnicate(); {STABLE_BODY} }}\n",
        (),
    ),
    "unstable": (
        "c++",
        "namespace at { struct Tensor; void fill_(Tensor&, double); }\n"
        "void keel_unstable(at::Tensor& t) { at::fill_(t, 1.0); }\n",
        (),
    ),
    "mixed": (
        "c++",
        'extern "C" {' + SHIM + "}\nnamespace c10 { struct Device; void check(const Device&); }\n"
        f"int keel_mixed(void* t, const c10::Device& d) {{ c10::check(d); {STABLE_BODY} }}\n",
        (),
    ),
    "vector": (
        "c++",
        "#include <vector>\nnamespace at { struct Tensor { long x; }; }\n"
        "namespace mylib { void consume(const std::vector<at::Tensor>&); }\n"
        "void keel_vector() { std::vector<at::Tensor> v(2); mylib::consume(v); }\n",
        (),
    ),
    "weak_c10": (
        "c++",
        "namespace c10 { template <class T> struct intrusive_ptr { T* p;\n"
        "  __attribute__((noinline)) T* get() const { return p; } }; }\n"
        "int keel_weak(c10::intrusive_ptr<int>& x) { return *x.get(); }\n",
        ("-O0",),
    ),
    # header-only torch code defined (weak) in the library: c10::toString(c10::ScalarType) and a
    # template of the library's own instantiated on c10::BFloat16 (both header-only in torch)
    "header_only_export": (
        "c++",
        'extern "C" {' + SHIM + "}\n"
        "namespace c10 { enum class ScalarType : signed char { Byte, BFloat16 };\n"
        '  __attribute__((noinline)) inline const char* toString(ScalarType t) { return t == ScalarType::Byte ? "Byte" : "BFloat16"; }\n'
        "  struct BFloat16 { unsigned short x; }; }\n"
        "namespace mylib { template <class T> __attribute__((noinline)) T twice(T v) { v.x *= 2; return v; } }\n"
        f'extern "C" int keel_s(void* t) {{ {STABLE_BODY} }}\n'
        'extern "C" int keel_ho(void* t, int k) { c10::BFloat16 b{1}; b = mylib::twice(b);\n'
        "  return c10::toString((c10::ScalarType)k)[0] + b.x + keel_s(t); }\n",
        ("-O1",),
    ),
    # the same header-only function, imported (not defined here)
    "header_only_import": (
        "c++",
        'extern "C" {' + SHIM + "}\n"
        "namespace c10 { enum class ScalarType : signed char; const char* toString(ScalarType t); }\n"
        f'extern "C" int keel_s(void* t) {{ {STABLE_BODY} }}\n'
        'extern "C" int keel_hi(void* t, int k) { return c10::toString((c10::ScalarType)k)[0] + keel_s(t); }\n',
        (),
    ),
    # a weak instantiation of the library's own template on at::Tensor (not header-only: its layout
    # is compiled in)
    "tensor_layout": (
        "c++",
        "namespace at { struct Tensor { void* impl; }; }\n"
        "namespace mylib { template <class T> __attribute__((noinline)) T pass(T v) { return v; } }\n"
        'extern "C" void* keel_tl(void* p) { at::Tensor t{p}; return mylib::pass(t).impl; }\n',
        ("-O1",),
    ),
    # c10::report_overflow is header-only only since torch 2.15; libc10 exports it before that
    "late_header_only": (
        "c++",
        "namespace c10 { void report_overflow(const char* name); }\n"
        'extern "C" void keel_ro(void) { c10::report_overflow("x"); }\n',
        (),
    ),
    # one definition involving a header-only type and a libtorch type: the libtorch type decides
    "mixed_layout": (
        "c++",
        "namespace c10 { struct BFloat16 { unsigned short x; }; }\n"
        "namespace at { struct Tensor { void* impl; }; }\n"
        "namespace mylib { template <class A, class B> __attribute__((noinline)) A pick(A a, B) { return a; } }\n"
        'extern "C" int keel_ml(void* p) { return mylib::pick(c10::BFloat16{1}, at::Tensor{p}).x; }\n',
        ("-O1",),
    ),
    "thp": ("c", "extern void* THPVariableClass;\nvoid* keel_thp(void) { return THPVariableClass; }\n", ()),
    "nonlimited": (
        "c",
        "extern void* PyLong_FromLong(long); extern int PyCode_Addr2Line(void*, int);\n"
        "int keel_py(void* c) { PyLong_FromLong(1); return PyCode_Addr2Line(c, 0); }\n",
        (),
    ),
    "pyfloor": (
        "c",
        "extern void* PyErr_GetRaisedException(void);\nvoid* keel_py(void) { return PyErr_GetRaisedException(); }\n",
        (),
    ),
    "libfoo": (
        "c++",
        "namespace c10 { struct Storage; void release(Storage&); }\nvoid foo(c10::Storage& s) { c10::release(s); }\n",
        ("-Wl,-soname,libfoo.so.1",),
    ),
    "plain": ("c", "int keel_plain(int x) { return x + 1; }\n", ()),
    "libc10": ("c", "int c10_dummy(void) { return 0; }\n", ("-Wl,-soname,libc10.so",)),
    "libcudart": ("c", "int cudart_dummy(void) { return 0; }\n", ("-Wl,-soname,libcudart.so.13",)),
    "libtorch": ("c", "int torch_dummy(void) { return 0; }\n", ("-Wl,-soname,libtorch.so",)),
    "libtorch_cpu": ("c", "int torch_cpu_dummy(void) { return 0; }\n", ("-Wl,-soname,libtorch_cpu.so",)),
}
# libraries linked against the dummies above: name -> (base source, link args)
LINKED = {
    "needs_c10": ("stable", ("-L{d}", "-Wl,--no-as-needed", "-l:libc10.so")),
    "needs_cudart": ("stable", ("-L{d}", "-Wl,--no-as-needed", "-l:libcudart.so.13")),
    "build_rpath": ("stable", ("-Wl,-rpath,/home/build/pytorch/torch/lib",)),
    "needs_libtorch": ("stable", ("-L{d}", "-Wl,--no-as-needed", "-l:libtorch.so", "-l:libtorch_cpu.so")),
    "needs_torch_cpu": ("stable", ("-L{d}", "-Wl,--no-as-needed", "-l:libtorch_cpu.so")),
}


def compile_library(out: Path, lang: str, source: str, extra: tuple[str, ...]) -> Path:
    """One shared object from C or C++ source (gcc/g++ -shared -fPIC -O2)."""
    src = out.with_suffix(".c" if lang == "c" else ".cpp")
    src.write_text(source)
    cc = "gcc" if lang == "c" else "g++"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(src), *extra], check=True)
    return out


def build_libraries(d: Path) -> dict[str, Path]:
    """Every fixture library of SOURCES and LINKED in `d`, plus a non-ELF and a truncated `.so`."""
    names = {
        "libc10": "libc10.so",
        "libcudart": "libcudart.so.13",
        "libfoo": "libfoo.so.1",
        "libtorch": "libtorch.so",
        "libtorch_cpu": "libtorch_cpu.so",
    }
    with ThreadPoolExecutor(2) as pool:
        done = {k: pool.submit(compile_library, d / names.get(k, f"{k}.so"), *v) for k, v in SOURCES.items()}
        out = {k: f.result() for k, f in done.items()}
        linked = {
            k: pool.submit(compile_library, d / f"{k}.so", "c", SOURCES[base][1], tuple(a.format(d=d) for a in args))
            for k, (base, args) in LINKED.items()
        }
        out.update({k: f.result() for k, f in linked.items()})
    (d / "notelf.so").write_text("this is not an ELF file\n")
    out["notelf"] = d / "notelf.so"
    data = out["stable"].read_bytes()
    (d / "truncated.so").write_bytes(data[: len(data) // 2])
    out["truncated"] = d / "truncated.so"
    return out


def make_wheel(
    path: Path,
    files: dict[str, Path | bytes],
    tag: str = "cp310-abi3-linux_x86_64",
    requires: tuple[str, ...] = ("torch>=2.10",),
    requires_python: str | None = None,
) -> Path:
    """A minimal wheel: the given files plus WHEEL/METADATA in a .dist-info."""
    dist = "fixture-0.1.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in files.items():
            zf.writestr(name, content if isinstance(content, bytes) else content.read_bytes())
        zf.writestr(f"{dist}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
        meta = "Metadata-Version: 2.1\nName: fixture\nVersion: 0.1\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires
        )
        if requires_python:
            meta += f"Requires-Python: {requires_python}\n"
        zf.writestr(f"{dist}/METADATA", meta)
        zf.writestr(f"{dist}/RECORD", "")
    return path


def torch_lib_dir() -> Path | None:
    """torch/lib of the torch importable by this interpreter (found, not imported), or None.

    Found through the import system, so any environment and any Python version works (not a path
    into one checkout's .venv/lib/python3.X).
    """
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return lib if lib.is_dir() else None


def torch_library(name: str) -> Path | None:
    """One library of the installed torch (`libc10.so`), or None."""
    lib = torch_lib_dir()
    path = lib / name if lib is not None else None
    return path if path is not None and path.is_file() else None


SYSTEM_LIB_DIR = Path("/usr/lib/x86_64-linux-gnu")


def interpreter_extensions() -> list[Path]:
    """The running interpreter's own extension modules (lib-dynload/*.so): real ELF shared objects
    that every CPython on Linux has, written by nobody here."""
    where = sysconfig.get_config_var("DESTSHARED")
    return sorted(Path(where).glob("*.so")) if where and Path(where).is_dir() else []


def load_script(name: str) -> ModuleType:
    """One of audit/scripts/*.py as a module (they are scripts, not part of the package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module
