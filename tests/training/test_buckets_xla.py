"""Graphs on real torch_xla (XLA:CPU): with length buckets a loop over 30 sequence
lengths compiles one graph per bucket, its masked losses the unpadded ones on the CPU;
and the habits docs/training.md warns about do add graphs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

TESTS = Path(__file__).resolve().parents[1]


def test_thirty_sequence_lengths_compile_no_more_graphs_than_buckets() -> None:
    code = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(TESTS)!r})
        import accel
        import torch_xla.debug.metrics as met
        from helpers.bucket_training import token_batch, train

        tpu = accel.get_accelerator("tpu")  # the XLA runtime starts before any backward()
        batches = [token_batch(8 + 8 * i) for i in range(30)]  # lengths 8 .. 240
        xla = train(tpu, batches, sizes=(32, 64, 128, 256))
        compiled = (met.metric_data("CompileTime") or [0])[0]
        cpu = train(accel.get_accelerator("cpu"), batches, sizes=None)
        print(json.dumps({{"compiled": compiled, "xla": xla, "cpu": cpu}}))
        """
    )
    found = _fresh(code)  # a fresh process: its own XLA graph cache, every compile counted
    assert 1 <= found["compiled"] <= 4, found["compiled"]  # 30 without buckets
    assert len(found["xla"]) == len(found["cpu"]) == 30
    for xla_loss, cpu_loss in zip(found["xla"], found["cpu"], strict=True):
        assert xla_loss == pytest.approx(cpu_loss, rel=1e-4, abs=1e-5)


def _fresh(code: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, "PJRT_DEVICE": "CPU"},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _graphs_with(habit: str) -> int:
    found = _fresh(
        f"""
        import json, sys
        sys.path.insert(0, {str(TESTS)!r})
        import accel
        from helpers.bucket_training import graphs_compiled_by

        print(json.dumps({{"graphs": graphs_compiled_by(accel.get_accelerator("tpu"), {habit!r})}}))
        """
    )
    return int(found["graphs"])  # type: ignore[call-overload]


def test_an_item_or_a_batch_fetched_mid_step_adds_graphs() -> None:
    plain = _graphs_with("none")
    assert plain == 1
    assert _graphs_with("item") > plain  # the step cut at the value read
    assert _graphs_with("fetch") > plain  # the step cut at the loader's mark
