"""tools/gpu/wheel_parts.py: wheels packed as parts small enough for one transfer each, checked
and unpacked where they arrive into a folder Python imports from; a missing or damaged part,
or a file that is no wheel, is one line naming it, exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

import wheel_parts  # noqa: E402 (tools/gpu is put on the path above)

KIB = 1024


def make_wheel(folder: Path) -> tuple[Path, dict[str, bytes]]:
    """A small wheel of a package ``parts_probe``: code, an incompressible blob (so the pack
    has several parts), a library the pack may drop, and its dist-info."""
    files = {
        "parts_probe/__init__.py": b"VALUE = 42\n",
        "parts_probe/blob.bin": os.urandom(300 * KIB),
        "parts_probe/capi/libunused.so": os.urandom(64 * KIB),
        "parts_probe-1.0.dist-info/METADATA": b"Name: parts_probe\nVersion: 1.0\n",
    }
    wheel = folder / "parts_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel, files


def packed(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    wheel, files = make_wheel(tmp_path)
    into = tmp_path / "parts"
    wheel_parts.pack([wheel], into, 100 * KIB, drop=["parts_probe/capi/*.so"], preset=1)
    return into, files


def test_parts_unpack_to_the_wheels_files_less_those_dropped_and_python_imports_them(tmp_path):
    into, files = packed(tmp_path)
    parts = sorted(into.glob("part-*/data"))
    assert len(parts) >= 3  # 364 KiB of random bytes in parts of 100 KiB
    assert all(part.stat().st_size <= 100 * KIB for part in parts)
    assert all((part.parent / wheel_parts.MANIFEST).is_file() for part in parts)
    site = tmp_path / "site"
    manifest = wheel_parts.unpack(into, site)
    assert manifest["files"] == 3
    for name, data in files.items():
        if name.endswith(".so"):
            assert not (site / name).exists()
        else:
            assert (site / name).read_bytes() == data
    imported = subprocess.run(
        [sys.executable, "-c", "import parts_probe; print(parts_probe.VALUE)"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == "42"


def test_parts_carried_alone_unpack_from_any_part_s_manifest(tmp_path):
    into, files = packed(tmp_path)
    (into / wheel_parts.MANIFEST).unlink()  # only the part folders travelled
    wheel_parts.unpack(into, tmp_path / "site")
    assert (tmp_path / "site" / "parts_probe" / "blob.bin").read_bytes() == files[
        "parts_probe/blob.bin"
    ]


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu" / "wheel_parts.py"), *args],
        capture_output=True,
        text=True,
    )


def test_a_missing_part_is_named_and_nothing_is_unpacked(tmp_path):
    into, _ = packed(tmp_path)
    (into / "part-2" / "data").unlink()
    done = run_tool("unpack", str(into), "--into", str(tmp_path / "site"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "part-2 missing" in done.stderr
    assert not (tmp_path / "site").exists()


def test_a_damaged_part_is_named_and_nothing_is_unpacked(tmp_path):
    into, _ = packed(tmp_path)
    data = into / "part-1" / "data"
    damaged = bytearray(data.read_bytes())
    damaged[100] ^= 0xFF
    data.write_bytes(bytes(damaged))
    done = run_tool("unpack", str(into), "--into", str(tmp_path / "site"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "part-1/data: damaged" in done.stderr
    assert not (tmp_path / "site").exists()


def test_a_pack_that_fails_midway_leaves_no_parts(tmp_path, monkeypatch):
    wheel, _ = make_wheel(tmp_path)
    real = wheel_parts.tarfile.TarFile.addfile
    written: list[bool] = []

    def breaks_on_the_last_file(self, entry, source=None):  # type: ignore[no-untyped-def]
        if entry.name.endswith("METADATA"):  # after the blob: parts are on disk by now
            written.append((tmp_path / "parts" / "part-1" / "data").exists())
            raise OSError("disk full")
        return real(self, entry, source)

    monkeypatch.setattr(wheel_parts.tarfile.TarFile, "addfile", breaks_on_the_last_file)
    with pytest.raises(OSError, match="disk full"):
        wheel_parts.pack([wheel], tmp_path / "parts", 64 * KIB, preset=1)
    assert written == [True]  # a part had been written, and is gone
    assert not (tmp_path / "parts").exists()


def test_a_name_that_would_unpack_outside_its_folder_is_refused(tmp_path):
    wheel = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("ok/a.py", b"")
        archive.writestr("../evil.py", b"")
    with pytest.raises(wheel_parts.PartsError, match="would unpack outside its folder"):
        wheel_parts.pack([wheel], tmp_path / "parts", 64 * KIB, preset=1)
    assert not (tmp_path / "parts").exists()


def test_an_unpack_that_fails_leaves_no_folder(tmp_path, monkeypatch):
    into, _ = packed(tmp_path)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(wheel_parts.tarfile.TarFile, "extractall", broken)
    with pytest.raises(wheel_parts.PartsError, match="did not unpack"):
        wheel_parts.unpack(into, tmp_path / "site")
    assert not (tmp_path / "site").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".site")] == []


@pytest.mark.parametrize(
    "what",
    [
        "not-a-wheel",
        "non-empty",
        "no-parts",
        "drop-nothing",
        "tiny-parts",
        "nan",
        "bad-manifest",
        "site-not-empty",
    ],
)
def test_a_bad_input_is_one_line_with_exit_status_2(tmp_path, what):
    wheel, _ = make_wheel(tmp_path)
    if what == "not-a-wheel":
        fake = tmp_path / "broken-1.0-py3-none-any.whl"
        fake.write_bytes(b"not a zip")
        done = run_tool("pack", str(fake), "--into", str(tmp_path / "parts"))
        expected = "not a wheel"
        assert not (tmp_path / "parts").exists()  # nothing written
    elif what == "non-empty":
        (tmp_path / "parts").mkdir()
        (tmp_path / "parts" / "left").write_text("x")
        done = run_tool("pack", str(wheel), "--into", str(tmp_path / "parts"))
        expected = "not empty"
    elif what == "no-parts":
        done = run_tool("unpack", str(tmp_path), "--into", str(tmp_path / "site"))
        expected = "not packed parts"
    elif what == "drop-nothing":  # a misspelt glob: what it meant to leave out would travel
        done = run_tool("pack", str(wheel), "--into", str(tmp_path / "parts"), "--drop", "*.sO")
        expected = "--drop '*.sO': matches no file"
        assert not (tmp_path / "parts").exists()
    elif what in ("tiny-parts", "nan"):
        size = "0.00001" if what == "tiny-parts" else "nan"
        done = run_tool("pack", str(wheel), "--into", str(tmp_path / "parts"), "--part-mib", size)
        expected = "--part-mib"
    elif what == "bad-manifest":
        (tmp_path / "parts").mkdir()
        (tmp_path / "parts" / wheel_parts.MANIFEST).write_text("[]")
        done = run_tool("unpack", str(tmp_path / "parts"), "--into", str(tmp_path / "site"))
        expected = "not a manifest of parts"
    else:
        into, _ = packed(tmp_path)
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "kept").write_text("x")
        done = run_tool("unpack", str(into), "--into", str(tmp_path / "site"))
        expected = "not an empty folder"
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and expected in done.stderr
    assert "Traceback" not in done.stderr
