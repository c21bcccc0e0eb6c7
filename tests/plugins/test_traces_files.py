"""`rllab traces` on files a real run leaves: hostile text in the HTML page, the logger's own
file name, cut-off and empty files, and the advantage's value (no model needed)."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from rllab.cli import main
from rllab_loggers import read_jsonl, trace_panels, traces_view
from rllab_loggers.traces import TracesConfig, read_traces, truncate_traces

HOSTILE = ["<!--<script>", "</script>", "]]>", "</SCRIPT >", "<script>alert(1)</script>", "a & b", "x\u2028y\u2029z",
           "<!--", "-->", "'\"`${x}`", "<\\/script>"]


def rec(step: int, *, prompt: str = "1+1=", texts=("2",), reward: float = 1.0, adv: float = 0.5, kind: str = "train",
        finish: str = "stop") -> dict:
    """A trace record as the logger writes it: 2 model tokens and one observation token between them."""
    tokens = [texts[0], "<obs>", "!"]
    model = [True, False, True]
    return {
        "kind": kind, "step": step, "group": 0, "prompt": prompt, "texts": list(texts), "tokens": tokens, "model": model,
        "turn": [1, 1, 2], "reward": reward, "components": {}, "turns": 2, "length": 2, "finish_reason": finish,
        "staleness": None, "token_versions": None, "advantages": [adv if m else 0.0 for m in model] if kind == "train" else [0.0] * 3,
        "sampler_logprobs": [-0.5, 0.0, -1.0], "trainer_logprobs": [-0.25, 0.0, -1.5] if kind == "train" else None,
        "mismatch": [-0.25, 0.5] if kind == "train" else None,
    }


def write(path: Path, recs, tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + tail, encoding="utf-8")
    return path


class Scripts(HTMLParser):
    """The page's <script> elements as a browser's tokenizer splits them (type, text)."""

    def __init__(self):
        super().__init__()
        self.scripts: list[list] = []
        self._in = False

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts.append([dict(attrs), ""])
            self._in = True

    def handle_endtag(self, tag):
        if tag == "script":
            self._in = False

    def handle_data(self, data):
        if self._in:
            self.scripts[-1][1] += data


def scripts_of(page: str) -> list[list]:
    p = Scripts()
    p.feed(page)
    p.close()
    return p.scripts


def test_hostile_text_cannot_end_or_comment_out_the_pages_script(tmp_path):
    recs = [rec(1, prompt=h, texts=(h,)) for h in HOSTILE] + [rec(2, prompt="plain", texts=("2",))]
    recs[0]["components"] = {"</script><!--": 1.0}
    page_file = traces_view.write_html(tmp_path / "p.html", recs, title="</title><script>", metrics=[])
    page = page_file.read_text(encoding="utf-8")
    scripts = scripts_of(page)
    # exactly the page's two scripts: the data and the code, whatever the samples say
    assert [s[0].get("id") for s in scripts] == ["data", None]
    data = json.loads(scripts[0][1])
    assert [r["prompt"] for r in data] == HOSTILE + ["plain"]  # the text round-trips, character for character
    assert data[0]["components"] == {"</script><!--": 1.0}
    assert [{k: v for k, v in r.items() if k != "advantage"} for r in data] == recs
    for ch in "<>&\u2028\u2029":
        assert ch not in scripts[0][1]
    assert "const recs = JSON.parse" in scripts[1][1] and scripts[1][1].rstrip().endswith("render();")
    assert "<title>rllab traces: &lt;/title&gt;&lt;script&gt;</title>" in page


def test_a_spec_conforming_parser_finds_the_same_two_scripts(tmp_path):
    """html5lib tokenizes as browsers do, comment-like text inside a script included (the stdlib parser
    ends a script at its first ``</script``, whatever came before)."""
    html5lib = pytest.importorskip("html5lib", reason="html5lib is not installed (pip install html5lib)")
    recs = [rec(1, prompt=h, texts=(h,)) for h in HOSTILE]
    page = traces_view.write_html(tmp_path / "p.html", recs, title="t", metrics=[]).read_text(encoding="utf-8")
    found = list(html5lib.parse(page, namespaceHTMLElements=False).iter("script"))
    assert [s.get("id") for s in found] == ["data", None]
    assert [{k: v for k, v in r.items() if k != "advantage"} for r in json.loads(found[0].text)] == recs
    assert found[1].text.rstrip().endswith("render();")


def test_a_non_finite_value_is_embedded_as_text_the_page_can_parse(tmp_path):
    r = rec(1)
    r["sampler_logprobs"][0] = float("-inf")
    page = traces_view.write_html(tmp_path / "p.html", [r], title="t", metrics=[]).read_text()
    text = scripts_of(page)[0][1]
    assert "Infinity" not in text and "NaN" not in text  # JSON.parse refuses both
    assert json.loads(text)[0]["sampler_logprobs"][0] == "-inf"


def test_the_page_and_the_panel_show_the_advantages_value(tmp_path):
    # trained tokens 0 and 2 at advantage 0.5 and -0.25 -> the sample's advantage is their mean, 0.125
    r = rec(1)
    r["advantages"] = [0.5, 0.0, -0.25]
    e = rec(1, kind="eval")
    assert traces_view.sample_advantage(r) == pytest.approx(0.125)
    assert traces_view.sample_advantage(e) is None  # not trained
    data = json.loads(scripts_of(traces_view.write_html(tmp_path / "p.html", [r, e], title="t", metrics=[]).read_text())[0][1])
    assert [d["advantage"] for d in data] == [pytest.approx(0.125), None]
    assert "advantage +0.125" in str(traces_view.panel(r, "advantage").title)
    assert "advantage" not in str(traces_view.panel(e, "advantage").title)


@pytest.mark.skipif(shutil.which("node") is None, reason="no node on this machine to run the page's script")
def test_the_pages_script_renders_every_hostile_sample_with_its_values(tmp_path):
    recs = [rec(1, prompt=h, texts=(h,), adv=-0.75) for h in HOSTILE]
    page = traces_view.write_html(tmp_path / "p.html", recs, title="t", metrics=[]).read_text()
    data, code = (s[1] for s in scripts_of(page))
    # a minimal DOM: the inputs' values, the data element's text, innerHTML of the sample list
    stub = """
const els = {};
const el = id => els[id] || (els[id] = {value: id === 'color' ? 'advantage' : '', textContent: '', innerHTML: '',
                                        addEventListener() {}});
globalThis.document = {getElementById: el, createElement: () => {
  const o = {set textContent(t) { this.innerHTML = String(t).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;'); }};
  return o; }};
el('data').textContent = require('fs').readFileSync(process.argv[2], 'utf8');
"""
    (tmp_path / "data.json").write_text(data, encoding="utf-8")
    (tmp_path / "page.js").write_text(stub + code + "\nconsole.log(JSON.stringify([els.count.textContent, els.samples.innerHTML]));",
                                      encoding="utf-8")
    out = subprocess.run(["node", str(tmp_path / "page.js"), str(tmp_path / "data.json")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    count, html_out = json.loads(out.stdout)
    assert count == f"{len(HOSTILE)} of {len(HOSTILE)} samples"
    assert html_out.count("· advantage -0.75 ·") == len(HOSTILE)  # in each sample's header
    assert html_out.count('title="advantage -0.75"') == 2 * len(HOSTILE)  # and on each of its 2 trained tokens
    assert "&lt;!--&lt;script&gt;" in html_out and "<script" not in html_out  # shown as text, never as markup


def test_the_command_reads_the_file_the_traces_logger_was_told_to_write(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('name = "run"\nloggers = ["jsonl", { name = "traces", per_step = 1, per_eval = 0, '
                                     'filename = "samples/t.jsonl" }]\n')
    assert main(["traces", str(run)]) == 2
    err = capsys.readouterr().err
    assert "samples/t.jsonl" in err and "does not exist yet" in err
    assert "run with the traces logger" not in err  # the user did
    (run / "samples").mkdir()
    write(run / "samples" / "t.jsonl", [rec(1), rec(2)])
    assert main(["traces", str(run)]) == 0
    assert "step 2 · group 0" in capsys.readouterr().out
    assert len(trace_panels(run)) == 1  # the front ends read the same file
    # a config without a traces logger: then the hint
    (run / "config.toml").write_text('loggers = ["jsonl"]\n')
    assert main(["traces", str(run)]) == 2
    assert "names no traces logger); run with the traces logger" in capsys.readouterr().err


def test_a_cut_off_last_line_is_left_out_naming_it(tmp_path, capsys):
    f = write(tmp_path / "traces.jsonl", [rec(1), rec(2), rec(3)], tail=json.dumps(rec(4))[:40])
    assert main(["traces", str(f), "--step", "3"]) == 0
    cap = capsys.readouterr()
    assert "line 4, the last, is cut off" in cap.err and "step 3 · group 0" in cap.out
    with pytest.warns(UserWarning, match="line 4, the last, is cut off"):
        assert [r["step"] for r in read_traces(f)] == [1, 2, 3]
    # a bad line before the last is not a cut: the file is refused, naming that line
    bad = write(tmp_path / "bad.jsonl", [rec(1)], tail="{oops\n" + json.dumps(rec(2)) + "\n")
    assert main(["traces", str(bad)]) == 2
    assert "line 2 is not JSON" in capsys.readouterr().err



def test_a_whole_last_line_that_is_not_json_is_named_not_called_cut_off(tmp_path, capsys):
    """Unclear message: a file whose one line is not JSON (ended by its newline, so whole) was
    called "cut off", then "empty: the run has traced no sample yet". Only a last line without its
    newline is a cut write; any other bad line is refused, naming it."""
    bad = tmp_path / "notes.jsonl"
    bad.write_text("not json at all\n")
    assert main(["traces", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 1 is not JSON" in err and "cut off" not in err and "empty" not in err
    f = write(tmp_path / "traces.jsonl", [rec(1)], tail="{oops\n")
    assert main(["traces", str(f)]) == 2
    assert "line 2 is not JSON" in capsys.readouterr().err

def test_a_resume_drops_a_cut_off_last_line_of_the_logs(tmp_path):
    write(tmp_path / "traces.jsonl", [rec(1), rec(2), rec(3)], tail=json.dumps(rec(4))[:40])
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "x": 1')
    with pytest.warns(UserWarning, match="line 4, the last, is cut off"):
        truncate_traces(run_dir=tmp_path, config=TracesConfig(), step=2)
    assert [r["step"] for r in read_traces(tmp_path / "traces.jsonl")] == [1, 2]
    from rllab_loggers import JsonlConfig, truncate_jsonl

    with pytest.warns(UserWarning, match="line 3, the last, is cut off"):
        truncate_jsonl(run_dir=tmp_path, config=JsonlConfig(), step=5)
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1}, {"step": 2}]


def test_an_empty_file_says_so_and_filters_are_named_only_when_given(tmp_path, capsys):
    empty = tmp_path / "traces.jsonl"
    empty.write_text("")
    for extra in ([], ["--html", str(tmp_path / "p.html")]):
        assert main(["traces", str(empty), *extra]) == 2
        err = capsys.readouterr().err
        assert "is empty: the run has traced no sample yet" in err and "filters" not in err
    assert not (tmp_path / "p.html").exists()
    only_eval = write(tmp_path / "e.jsonl", [rec(0, kind="eval")])
    assert main(["traces", str(only_eval)]) == 2
    assert "holds no training samples, only evaluation answers: show them with --eval" in capsys.readouterr().err
    assert main(["traces", str(only_eval), "--eval"]) == 0
    only_train = write(tmp_path / "t.jsonl", [rec(1)])
    assert main(["traces", str(only_train), "--eval"]) == 2
    assert "holds no evaluation answers" in capsys.readouterr().err
    assert main(["traces", str(only_train), "--min-reward", "5"]) == 2
    assert "no sample passes the filters (--min-reward 5.0)" in capsys.readouterr().err
    assert main(["traces", str(only_train), "--min-reward", "5", "--html", str(tmp_path / "p.html")]) == 2
    assert "no sample passes the filters (--min-reward 5.0); no page written" in capsys.readouterr().err
    assert main(["traces", str(only_train), "--grep", "zzz", "--finish", "stop"]) == 2
    assert "no sample passes the filters (--finish 'stop', --grep 'zzz')" in capsys.readouterr().err
    assert main(["traces", str(only_train), "--min-reward", "2", "--max-reward", "1"]) == 2  # a range nothing passes
    assert capsys.readouterr().err.strip() == "rllab traces: --min-reward 2.0 is above --max-reward 1.0: no reward passes both"


def test_a_page_of_the_evaluations_answers_holds_them_alone(tmp_path, capsys):
    """Silently ignored: ``--html --eval`` wrote the training samples too."""
    f = write(tmp_path / "traces.jsonl", [rec(0, kind="eval"), rec(1), rec(1, kind="eval", prompt="2+2=")])
    for extra, kinds in (([], ["eval", "train", "eval"]), (["--eval"], ["eval", "eval"])):
        assert main(["traces", str(f), "--html", str(tmp_path / "p.html"), *extra]) == 0
        data = json.loads(scripts_of((tmp_path / "p.html").read_text())[0][1])
        assert [d.get("kind", "train") for d in data] == kinds
    assert "(2 samples)" in capsys.readouterr().out.splitlines()[-1]
    for color in ("advantage", "gap"):  # --color: the page's colouring until the reader picks another
        assert main(["traces", str(f), "--html", str(tmp_path / "p.html"), "--color", color]) == 0
        assert f'<option value="{color}" selected>' in (tmp_path / "p.html").read_text()
        assert (tmp_path / "p.html").read_text().count(" selected>") == 1


def test_a_step_with_only_the_other_kind_says_how_to_see_it(tmp_path, capsys):
    f = write(tmp_path / "traces.jsonl", [rec(0, kind="eval"), rec(1), rec(2)])
    assert main(["traces", str(f), "--step", "0"]) == 2
    assert "step 0 has only evaluation answers: show them with --eval" in capsys.readouterr().err
    assert main(["traces", str(f), "--step", "0", "--eval"]) == 0
    assert main(["traces", str(f), "--step", "2", "--eval"]) == 2
    assert "step 2 has only training samples: show them with no --eval" in capsys.readouterr().err
    assert main(["traces", str(f), "--step", "5"]) == 2
    assert "no samples of step 5; traced steps: 1, 2" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["", "sub/", "/tmp/abs.jsonl", "../out.jsonl"])
@pytest.mark.parametrize("logger", ["traces", "jsonl"])
def test_a_log_file_outside_the_run_directory_is_refused(logger, bad):
    from rllab.config import load_config
    from rllab.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"logger '{logger}' .*filename = {bad!r} must name a file inside the run directory"):
        load_config(None, [f'loggers=[{{name="{logger}", filename="{bad}"}}]'])


def test_the_done_line_points_at_the_traces_the_logger_wrote(tmp_path):
    from rllab_console import next_steps

    (tmp_path / "config.toml").write_text('loggers = [{ name = "traces", filename = "tr/t.jsonl" }]\n')
    assert "rllab traces" not in next_steps(tmp_path)
    (tmp_path / "tr").mkdir()
    write(tmp_path / "tr" / "t.jsonl", [rec(1)])
    assert f"the samples: rllab traces {tmp_path}" in next_steps(tmp_path)


def test_markup_in_a_component_name_is_shown_as_text(capsys):
    r = rec(1)
    r["components"] = {"fmt[/]": 1.0, "[bold]x": 0.0}
    traces_view.show([r], color="advantage")
    out = capsys.readouterr().out
    assert "fmt[/]=1" in out and "[bold]x=0" in out
