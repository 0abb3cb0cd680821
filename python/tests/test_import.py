"""`import ghtier` without PyTorch, the version, the statistics, and ghtier.plan's wrapper."""
import json
import os
import stat
import sys
import textwrap

import pytest

import ghtier


def test_import_without_torch(python):
    # torch blocked in sys.modules: any `import torch` raises ImportError.
    r = python(textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        import ghtier
        assert "torch" not in sys.modules or sys.modules["torch"] is None
        stats = ghtier.memory_stats()
        assert stats["tiers"]["host"]["present"], stats
        print("version", ghtier.__version__)
        try:
            import ghtier.torch
        except ImportError as e:
            print("import error:", e)
        else:
            raise SystemExit("ghtier.torch imported without torch")
    """))
    assert r.returncode == 0, r.stderr
    assert "version 0." in r.stdout
    assert "ghtier.torch needs PyTorch" in r.stdout


def test_version_matches_extension():
    assert ghtier.__version__ == ghtier.core().__version__


def test_memory_stats_counts_host_tensors():
    core = ghtier.core()
    before = ghtier.memory_stats()["classes"]["master"]["current"]
    torch = pytest.importorskip("torch")
    t = core.host_tensor(1 << 20, core.CLASS_MASTER)
    assert isinstance(t, torch.Tensor) and t.numel() == 1 << 20 and t.device.type == "cpu"
    t.fill_(3)  # host memory the CPU writes
    assert ghtier.memory_stats()["classes"]["master"]["current"] == before + (1 << 20)
    assert core.where(t.data_ptr())["tier"] == "host"
    del t
    assert ghtier.memory_stats()["classes"]["master"]["current"] == before


def test_plan_without_cli_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("GHTIER_CLI", "/nonexistent/ght")
    with pytest.raises(ghtier.PlanError, match="could not run"):
        ghtier.plan()
    monkeypatch.delenv("GHTIER_CLI")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(ghtier, "_find_ght", lambda: None)
    with pytest.raises(ghtier.PlanError, match="GHTIER_CLI"):
        ghtier.plan()


def test_plan_parses_the_cli_json(tmp_path, monkeypatch):
    fake = tmp_path / "ght"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    "print(json.dumps({'argv': sys.argv[1:]}))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("GHTIER_CLI", str(fake))
    assert ghtier.plan(["--config", "x.toml"]) == {"argv": ["plan", "--json", "--config", "x.toml"]}
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('bad config')\nsys.exit(2)\n")
    with pytest.raises(ghtier.PlanError, match="exited with 2: bad config"):
        ghtier.plan()
