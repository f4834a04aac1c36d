"""Length buckets on real torch_xla (XLA:CPU): a loop over 30 sequence lengths compiles
one graph per bucket, and its masked losses are the unpadded ones on the CPU."""

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
    # A fresh process: its own XLA graph cache, so every compilation is counted.
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PJRT_DEVICE": "CPU"},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert 1 <= found["compiled"] <= 4, found["compiled"]  # 30 without buckets
    assert len(found["xla"]) == len(found["cpu"]) == 30
    for xla_loss, cpu_loss in zip(found["xla"], found["cpu"], strict=True):
        assert xla_loss == pytest.approx(cpu_loss, rel=1e-4, abs=1e-5)
