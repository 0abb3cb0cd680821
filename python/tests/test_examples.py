"""The package's example runs and learns (examples/torch_offload_adamw.py), on the CPU here; on
a GPU machine also on its default path, with the update in backward."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_offload_adamw.py")


def run_example(*args):
    return subprocess.run([sys.executable, EXAMPLE, "--steps", "25", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("args", [("--cpu",), ("--cpu", "--state", "q8", "--in-backward")])
def test_example_learns_on_the_cpu(args):
    r = run_example(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: loss" in r.stdout and "loaded into torch.optim.AdamW" in r.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA device")
@pytest.mark.parametrize("args", [(), ("--in-backward",), ("--path", "device")])
def test_example_learns_on_the_gpu(args):
    r = run_example(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: loss" in r.stdout
