"""FEATURES_DEVICE=auto on a machine with a GPU whose runtime compiler does not work:
the demo data still loads, on the CPU, with one warning that says why (the kernel is
compiled when the program is built, not on the first batch of the load)."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest

import features.kernels.device as device
from features.config import Settings
from features.load import load
from features.ops.demo import generate_files
from features.ops.examples import applicant_schema

pytestmark = pytest.mark.services


def test_auto_loads_the_demo_data_on_the_cpu_with_one_warning_when_the_kernel_cannot_compile(
        settings: Settings, pg_schema: str, redis_prefix: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    attempts: list[str] = []

    class RawKernel:  # a CUDA device is there; compiling fails (no libnvrtc, say)
        def __init__(self, code: str, name: str, *, options: tuple[str, ...]) -> None:
            self.name = name

        def compile(self) -> None:
            attempts.append(self.name)
            raise OSError("libnvrtc.so.12: cannot open shared object file")

    monkeypatch.setattr(device, "find_gpu", lambda: (types.SimpleNamespace(RawKernel=RawKernel), ""))
    paths = generate_files(tmp_path, 3_000, 2)
    with caplog.at_level("WARNING", logger="features.kernels"):
        summary = load(paths, applicant_schema(), dataclasses.replace(settings, device="auto"),
                       search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up and summary.stored > 2_500
    assert attempts == ["fl_transform_credit_applicant"]  # once, at the start
    warnings = [r.getMessage() for r in caplog.records if r.name == "features.kernels"]
    assert len(warnings) == 1 and "libnvrtc.so.12" in warnings[0] and "on the CPU" in warnings[0]
