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


def test_plan_of_a_transformers_shaped_config(tmp_path, monkeypatch):
    # The config becomes a model TOML for `ght plan --model`, tokens per step its flag; the fake
    # CLI echoes the TOML it was given.
    fake = tmp_path / "ght"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    "a = sys.argv[1:]\n"
                    "toml = open(a[a.index('--model') + 1]).read()\n"
                    "print(json.dumps({'argv': a, 'toml': toml}))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("GHTIER_CLI", str(fake))
    from types import SimpleNamespace
    cfg = SimpleNamespace(model_type="qwen3_moe", hidden_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=None, num_experts=8,
                          num_experts_per_tok=2, moe_intermediate_size=128, norm_topk_prob=True,
                          rope_theta=1e6, vocab_size=1000, tie_word_embeddings=False,
                          rms_norm_eps=1e-6, max_position_embeddings=512)
    out = ghtier.plan(SimpleNamespace(config=cfg), 4096, profile="gh200")
    assert out["argv"][-4:] == ["--tokens-per-step", "4096", "--profile", "gh200"]
    for line in ("d_model = 256", "head_dim = 64", "experts = 8", "tied_embeddings = false",
                 "seq_len = 512", "vocab = 1000"):
        assert line in out["toml"], out["toml"]
    del cfg.num_experts
    with pytest.raises(ValueError, match="no 'num_experts'"):
        ghtier.plan(cfg, 4096)


def test_plan_of_a_config_with_the_real_cli(monkeypatch):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    exe = os.path.join(root, os.environ.get("GHT_BUILD_DIR", "build"), "bin", "ght")
    if not os.access(exe, os.X_OK):
        pytest.skip(f"no `ght` CLI at {exe} (cmake --build build --target ght)")
    monkeypatch.setenv("GHTIER_CLI", exe)
    from types import SimpleNamespace
    cfg = SimpleNamespace(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=64, norm_topk_prob=True, rope_theta=1e6,
                          vocab_size=512, tie_word_embeddings=True, rms_norm_eps=1e-6,
                          max_position_embeddings=128)
    out = ghtier.plan(cfg, 128 * 8, profile="pcie5")
    assert isinstance(out, dict) and out, out
    with pytest.raises(ghtier.PlanError, match="not a multiple of seq_len"):
        ghtier.plan(cfg, 100, profile="pcie5")
