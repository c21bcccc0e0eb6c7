"""``rllab plugins`` keeps its table between calls: the second listing imports no component (nor
torch) and prints the same; a change to a plugin's files, or another plugin, lists afresh."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import rllab
from rllab.cli import listing, main

ROOT = Path(__file__).resolve().parent.parent
PROBE = "import sys; from rllab.cli import main; main(sys.argv[1:]); print('torch imported:', 'torch' in sys.modules)"


def _plugins(tmp_path, *args):
    env = {**os.environ, "RLLAB_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", PROBE, "plugins", *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    table, _, last = out.stdout.rstrip("\n").rpartition("\n")
    return table, last


def test_the_second_listing_imports_no_component_and_prints_the_same(tmp_path):
    first, imported = _plugins(tmp_path)
    assert imported == "torch imported: True" and "ppo_clip" in first and "grpo" in first
    for _ in range(3):  # a source file edited meanwhile (a working checkout) is a new key: listed afresh, then kept
        second, imported = _plugins(tmp_path)
        if imported == "torch imported: False":
            break
    assert imported == "torch imported: False"
    assert second == first
    kind, _ = _plugins(tmp_path, "--kind", "policy_loss")
    assert "ppo_clip" in kind and "grpo " not in kind


PLUGIN = '''
import attrs
import rllab


@attrs.frozen
class Config:
    scale: float = rllab.knob(1.0, help="a scale")


def {name}(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """{summary}"""
    return aggregate(-advantages * log_prob, mask)


@rllab.hookimpl
def register_policy_losses(register):
    register("{name}", {name}, config=Config)
'''


def test_a_changed_plugin_file_is_listed_afresh(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path / "cache"))
    plugin = tmp_path / "mine.py"
    plugin.write_text(textwrap.dedent(PLUGIN.format(name="first_loss", summary="The first one.")))
    assert main(["plugins", "--kind", "policy_loss", "--plugin", str(plugin)]) == 0
    assert "first_loss" in capsys.readouterr().out
    assert len(list((tmp_path / "cache").glob("plugin-listing-*.json"))) == 1
    plugin.write_text(textwrap.dedent(PLUGIN.format(name="second_loss", summary="The second one.")))
    st = plugin.stat()
    os.utime(plugin, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later modification time, whatever the clock's resolution
    assert main(["plugins", "--kind", "policy_loss", "--plugin", str(plugin)]) == 0
    out = capsys.readouterr().out
    assert "second_loss" in out and "first_loss" not in out
    assert main(["plugins", "--kind", "policy_loss"]) == 0  # without the plugin: another listing
    assert "second_loss" not in capsys.readouterr().out


def test_a_plugin_without_a_file_is_never_cached():
    class Obj:
        @rllab.hookimpl
        def register_policy_losses(self, register):
            pass

    lab = rllab.Lab(plugins=[Obj()], defer=True)
    assert listing.fingerprint(lab) is None
    assert listing.fingerprint(rllab.Lab(defer=True)) is not None


def test_a_repeated_show_prints_the_same_without_loading_the_components(tmp_path):
    first, imported = _plugins(tmp_path, "show", "ppo_dual_clip")
    assert imported == "torch imported: True" and "ppo_dual_clip — policy_loss" in first and "clip_c " in first
    for _ in range(3):  # as above: a file edited meanwhile is a new key
        second, imported = _plugins(tmp_path, "show", "ppo_dual_clip")
        if imported == "torch imported: False":
            break
    assert imported == "torch imported: False" and second == first
    doc, _ = _plugins(tmp_path, "show", "ppo_dual_clip", "--doc")  # another rendering: kept apart
    assert "module notes" in doc and doc != first


def test_an_unknown_name_is_not_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path))
    assert main(["plugins", "show", "grop"]) == 1
    assert "Did you mean 'grpo'" in capsys.readouterr().err
    kept = list(tmp_path.glob("plugin-shows-*.json"))
    assert all("grop" not in p.read_text() for p in kept)
