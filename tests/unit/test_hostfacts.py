"""Host facts: the built-in labels, GPU models from the driver's /proc files and the
data keys under declared directories, all total on odd input."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from swarm.policy.datakeys import valid_data_key
from swarm.runtime import hostfacts as hf


def test_discover_basic_labels() -> None:
    labels = hf.discover()
    for name in ("arch", "os", "kernel", "hostname", "cpus", "mem"):
        assert labels.get(name), name
    assert labels["arch"] == platform.machine()
    assert labels["os"] == platform.system().lower()
    assert labels["kernel"] == platform.release()
    assert 1 <= int(labels["cpus"]) <= (os.cpu_count() or 1)
    assert labels["mem"].endswith("G") and int(labels["mem"][:-1]) >= 1
    assert not any(k.startswith("gpu.") for k in labels)
    assert all(isinstance(v, str) and v for v in labels.values())


def test_discover_gpu_labels_only_with_models() -> None:
    labels = hf.discover(gpu_models=["NVIDIA H200", "NVIDIA H200"])
    assert labels["gpu.count"] == "2"
    assert labels["gpu.model"] == "NVIDIA-H200"
    assert "gpu.count" not in hf.discover(gpu_models=[])


def test_os_release_parsing(tmp_path: Path) -> None:
    rel = tmp_path / "os-release"
    rel.write_text(
        '# comment\nNAME="Debian GNU/Linux"\nID=debian\nVERSION_ID="12"\n'
        'junk line\nPRETTY=\'single\'\nBAD="unbalanced\nESC="a\\"b"\n\n'
    )
    got = hf.os_release([tmp_path / "missing", rel])
    assert got["ID"] == "debian"
    assert got["VERSION_ID"] == "12"
    assert got["PRETTY"] == "single"
    assert got["BAD"] == '"unbalanced'
    assert got["ESC"] == 'a"b'
    assert hf.os_release([tmp_path / "missing"]) == {}
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00ID=\xc3(\n")
    assert isinstance(hf.os_release([tmp_path / "binary"]), dict)


def _fake_gpu(root: Path, bus: str, text: str) -> None:
    (root / bus).mkdir(parents=True)
    (root / bus / "information").write_text(text)


def test_gpu_models_from_proc(tmp_path: Path) -> None:
    root = tmp_path / "gpus"
    info = "Model: \t\t NVIDIA H200\nIRQ:   42\nGPU UUID: GPU-abc\nBus Type: PCIe\n"
    _fake_gpu(root, "0000:19:00.0", info)
    _fake_gpu(root, "0000:3b:00.0", info)
    _fake_gpu(root, "0000:5d:00.0", "IRQ: 7\n")  # no Model line: skipped
    assert hf.gpu_models_from_proc(root) == ["NVIDIA H200", "NVIDIA H200"]
    assert hf.gpu_models_from_proc(tmp_path / "absent") == []
    labels = hf.discover(gpu_models=hf.gpu_models_from_proc(root))
    assert (labels["gpu.count"], labels["gpu.model"]) == ("2", "NVIDIA-H200")


def test_scan_data_dirs(tmp_path: Path) -> None:
    a = tmp_path / "a"
    b = tmp_path / "b"
    for d, names in ((a, ["imagenet", "coco", ".cache", "has space"]), (b, ["imagenet", "z"])):
        d.mkdir()
        for n in names:
            (d / n).mkdir()
    (a / "file.tar").write_text("x")
    ra, rb = a.resolve(), b.resolve()

    keys = hf.scan_data_dirs([a, tmp_path / "missing", b])
    assert keys == [
        "coco",
        f"{ra}/coco",
        "file.tar",
        f"{ra}/file.tar",
        f"{ra}/has space",  # the name is no valid key; the path is
        "imagenet",
        f"{ra}/imagenet",
        f"{rb}/imagenet",
        "z",
        f"{rb}/z",
    ]
    assert not any(".cache" in k for k in keys)
    assert all(valid_data_key(k) for k in keys)
    assert hf.scan_data_dirs([a, b]) == keys  # deterministic

    assert hf.scan_data_dirs([a, b], limit=3) == keys[:3]
    assert hf.scan_data_dirs([a, b], limit=0) == []
    assert hf.scan_data_dirs([tmp_path / "missing"]) == []
    assert hf.scan_data_dirs([a / "file.tar"]) == []  # not a directory


def test_scan_data_dirs_relative_path_resolves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").mkdir()
    monkeypatch.chdir(tmp_path)
    assert hf.scan_data_dirs([Path("d")]) == ["x", f"{(tmp_path / 'd').resolve()}/x"]
