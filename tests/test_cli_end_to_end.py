"""End to end through fairseq's installed CLIs with --user-dir, as a user runs them."""

import os
import subprocess
import sys

import pytest
import torch

from fairseq_helpers import USER_DIR, generate, hypotheses, run_cli, tiny_model_flags, train

pytestmark = pytest.mark.slow

FAMILIES = {
    "prenorm": ["--arch", "deepnmt_transformer", "--encoder-layers", "2", "--decoder-layers", "2"],
    "postnorm": ["--arch", "deepnmt_transformer", "--post-norm", "--encoder-layers", "2", "--decoder-layers", "2"],
    "transparent": ["--arch", "deepnmt_transformer", "--deep-memory", "transparent", "--encoder-layers", "3",
                    "--decoder-layers", "2"],
    "msc": ["--arch", "deepnmt_transformer", "--deep-memory", "msc", "--msc-block-layers", "2",
            "--decoder-layers", "2"],
}


@pytest.fixture(scope="module")
def trained(data_bin, tmp_path_factory):
    """One tiny model per family, trained for 3 updates by fairseq-train."""
    out = {}
    for name, flags in FAMILIES.items():
        save = tmp_path_factory.mktemp(f"ckpt-{name}")
        arch_flags = flags[2:]
        train(data_bin, save, flags[1], [*tiny_model_flags(), "--share-all-embeddings", *arch_flags])
        out[name] = save / "checkpoint_last.pt"
    return out


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_train_and_generate(trained, data_bin, name):
    ckpt = trained[name]
    assert ckpt.exists()
    res = generate(data_bin, ckpt, beam=4)
    hyps = hypotheses(res.stdout)
    assert len(hyps) == 10, res.stdout[-2000:]  # every test sentence, none dropped


def test_generate_without_env_override_uses_weights_only(trained, data_bin):
    env = {k: v for k, v in os.environ.items() if "WEIGHTS_ONLY" not in k}
    exe = os.path.join(os.path.dirname(sys.executable), "fairseq-generate")
    res = subprocess.run(
        [exe, str(data_bin), "--user-dir", USER_DIR, "--path", str(trained["msc"]), "--beam", "1",
         "--batch-size", "4", "--required-batch-size-multiple", "1", "--cpu", "--max-len-b", "5"],
        capture_output=True, text=True, env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(hypotheses(res.stdout)) == 10


def test_without_the_plugin_torch_refuses_the_checkpoint(trained):
    """The problem the plugin solves: plain torch >= 2.6 refuses a fairseq checkpoint."""
    code = (
        "import torch, sys\n"
        "try:\n"
        f"    torch.load({str(trained['prenorm'])!r}, map_location='cpu')\n"
        "except Exception as e:\n"
        "    print('REFUSED', type(e).__name__); sys.exit(0)\n"
        "print('LOADED')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "REFUSED" in out.stdout


def test_malicious_checkpoint_refused_by_fairseq_generate(data_bin, tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    code = (
        "import os, torch\n"
        "class Evil:\n"
        f"    def __reduce__(self): return (os.system, ('touch {marker}',))\n"
        f"torch.save({{'model': {{}}, 'args': None, 'cfg': None, 'x': Evil()}}, {str(evil)!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    res = run_cli("fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", evil, "--cpu", check=False)
    assert res.returncode != 0
    assert "Refusing to load checkpoint" in res.stderr and str(evil) in res.stderr
    assert not marker.exists()


def test_interactive_and_validate(trained, data_bin):
    ckpt = trained["transparent"]
    res = run_cli("fairseq-validate", data_bin, "--user-dir", USER_DIR, "--path", ckpt, "--cpu", "--task", "translation",
                  "--valid-subset", "valid", "--max-tokens", "500")
    assert "valid on 'valid' subset" in (res.stdout + res.stderr)
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "fairseq-interactive"), str(data_bin), "--user-dir",
         USER_DIR, "--path", str(ckpt), "--cpu", "--beam", "2", "--source-lang", "src", "--target-lang", "tgt"],
        input="the cat sees a dog\nbig red house\n", capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 2


def test_average_checkpoints_cli(data_bin, tmp_path):
    save = tmp_path / "ckpt"
    train(data_bin, save, "deepnmt_transformer",
          [*tiny_model_flags(), "--share-all-embeddings", "--encoder-layers", "2", "--decoder-layers", "1",
           "--save-interval-updates", "1", "--keep-interval-updates", "3"], max_update=4)
    out = tmp_path / "avg.pt"
    run_cli("deepnmt-average-checkpoints", "--inputs", save, "--num-update-checkpoints", "3", "--output", out)
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    avg = load_checkpoint(str(out))
    newest = sorted(save.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.split("_")[-1]))[-3:]
    assert [os.path.basename(p) for p in avg["averaged_from"]] == [p.name for p in newest]
    parts = [load_checkpoint(str(p)) for p in newest]
    key = "encoder.layers.0.fc1.weight"
    assert torch.allclose(avg["model"][key], sum(p["model"][key] for p in parts) / 3, atol=1e-6)
    again = run_cli("deepnmt-average-checkpoints", "--inputs", save, "--num-update-checkpoints", "3",
                    "--output", out, check=False)
    assert again.returncode != 0 and "exists" in again.stderr  # never overwrites silently
    res = generate(data_bin, out, beam=2)
    assert len(hypotheses(res.stdout)) == 10


def test_user_dir_one_liners(tmp_path):
    printed = run_cli("deepnmt-user-dir").stdout.strip()
    assert os.path.samefile(printed, USER_DIR)
    out = subprocess.run([sys.executable, "-m", "deepnmt_fairseq"], capture_output=True, text=True, check=True)
    assert os.path.samefile(out.stdout.strip().splitlines()[-1], USER_DIR)


def test_collapse_reducing_criterion_trains_4_4_cad_model_and_decodes(data_bin, tmp_path):
    save = tmp_path / "ckpt"
    res = train(data_bin, save, "deepnmt_transformer",
                [*tiny_model_flags(), "--share-all-embeddings", "--encoder-layers", "4", "--decoder-layers", "4",
                 "--cad-drop-depth", "3", "--cad-drop-ratio", "0.5", "--ddr-alpha", "1.0", "--ald-alpha", "0.5",
                 "--encoder-l2", "1e-5"],
                criterion="collapse_reducing", max_update=3)
    log = res.stdout + res.stderr
    for term in ("ddr_loss", "ald_loss", "ce_loss", "encoder_l2"):
        assert term in log, term  # each term logged separately
    out = generate(data_bin, save / "checkpoint_last.pt", beam=3)
    assert len(hypotheses(out.stdout)) == 10
