"""What ``rllab replay`` and ``rllab record`` accept, checked before anything loads or runs.

:func:`open_record` reads a recording, or says what the file is instead (a config, a run
directory, a training checkpoint, a truncated file) and how to make a recording.
:func:`check_replay_overrides` refuses a variant's override that a replay cannot honour: a replay
reruns the loss side of the ``rl`` algorithm on the recorded batches — the same weights, task and
samples — so only :data:`REPLAY_VARIES` can differ between its variants.
"""

from __future__ import annotations

import pickle
import tomllib
import zipfile
from pathlib import Path
from typing import Sequence

from rllab import RllabError
from rllab.config import COMPONENT_SECTIONS, PLAIN_SECTIONS

REPLAY_VARIES = (
    "algorithm.*", "advantage", "policy_loss", "correction", "aggregation", "kl", "kl_controller", "value_loss",
    "train.lr", "train.critic_lr", "train.weight_decay", "train.max_grad_norm", "train.nonfinite", "train.seed",
    "model.logprob_chunk", "plugins",
)
"""What a replay variant may change: the ``rl`` algorithm's knobs, the loss-side components (name and
knobs), the optimizer step's settings (``train.lr`` is scaled by the recorded schedule factor;
``train.nonfinite`` decides whether a non-finite update stops the replay or is skipped;
``train.seed`` orders the minibatches), the log-prob chunk size, and extra plugins. Everything else
— model, task or environment, backend, rollout, the rest of train, schedule — is the recording's."""


_ZIP_MAGIC = b"PK\x03\x04"


def _override_key(override: str) -> str:
    """The key of a ``key=value`` override (``algorithm=dpo`` → ``algorithm``)."""
    return override.split("=", 1)[0].strip()


def _fixed_by_the_run(key: str) -> bool:
    """Whether a run fixes ``key`` for its whole life (:data:`RECORD_KEEPS`; the algorithm's knobs may change)."""
    return key in (*RECORD_KEEPS, "algorithm.name") or key.startswith(("model.", "task.", "env.", "backend."))
_HOW = "a recording is written by: rllab record RUN_DIR_or_config --steps K --out FILE.pt"


def varies_text() -> str:
    """:data:`REPLAY_VARIES` as one line, for error messages."""
    sections = ", ".join(k for k in REPLAY_VARIES if "." not in k and k != "plugins")
    settings = ", ".join(k for k in REPLAY_VARIES if "." in k and not k.endswith(".*"))
    return f"algorithm.* (the rl algorithm's knobs); {sections} (components and knobs); {settings}; plugins"


def _what_dir(path: Path) -> str:
    if (path / "config.toml").is_file():
        return (f"{path} is a run directory; rllab replay takes a recording of rollout batches. Record some from its "
                f"latest checkpoint: rllab record {path} --steps 1 --out {path.name}.pt, then: rllab replay {path.name}.pt VARIANT…")
    return f"{path} is a directory, not a recording; {_HOW}"


def _what_text(path: Path, head: bytes) -> str:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = "\x00"
    if "\x00" in text:
        return f"{path} is not a recording (not a file written by torch.save); {_HOW}"
    try:
        tomllib.loads(path.read_text())
        kind = "a TOML file (an experiment config?)"
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
        first = next((ln for ln in text.splitlines() if ln.strip()), "")[:60]
        kind = f"a text file (it starts {first!r})"
    return (f"{path} is {kind}, not a recording. rllab replay takes a .pt file written by rllab record; from a config: "
            f"rllab record {path} --steps 1 --out {path.with_suffix('.pt').name}, then: rllab replay {path.with_suffix('.pt').name} VARIANT…")


def _what_torch_file(path: Path, fmt: str) -> str:
    import torch

    try:
        data = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as e:  # any failure here is a corrupt file
        return f"{path} cannot be read ({type(e).__name__}: {e}); {_HOW}"
    if isinstance(data, dict) and "format" in data:
        return f"{path} is a recording of format {data['format']!r}; this rllab reads {fmt!r}: record it again. {_HOW}"
    if isinstance(data, dict) and {"policy", "optimizer", "step"} <= set(data):
        run = path.parent.parent.parent if path.parent.parent.name == "checkpoints" else None
        where = str(run) if run is not None else "RUN_DIR"
        return (f"{path} is a training checkpoint (the state a run saves to resume, after step {data['step']}), not a "
                f"recording. Record batches from the run's latest checkpoint: rllab record {where} --steps 1 --out rec.pt")
    kind = f"a dict with keys {', '.join(map(str, list(data)[:6]))}" if isinstance(data, dict) else f"a {type(data).__name__}"
    return f"{path} is a torch file holding {kind}, not a recording; {_HOW}"


def open_record(path: Path) -> dict:
    """The recording at ``path`` (through :func:`rllab_suite.replay.load_record`), or an error that
    says what the file is and how to make a recording."""
    from rllab_suite import replay

    path = Path(path)
    if not path.exists():
        raise RllabError(f"no recording at {path} (make one with: rllab record RUN_DIR_or_config --steps K --out {path})")
    if path.is_dir():
        raise RllabError(_what_dir(path))
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        raise RllabError(f"{path} is empty (an interrupted write?), not a recording; {_HOW}")
    if not head.startswith(_ZIP_MAGIC):
        raise RllabError(_what_text(path, head))
    try:
        return replay.load_record(path)
    except RllabError:
        raise RllabError(_what_torch_file(path, replay.FORMAT)) from None
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, zipfile.BadZipFile) as e:
        reason = str(e).split(". ")[0].splitlines()[0] if str(e) else type(e).__name__
        raise RllabError(f"{path} is truncated or corrupt ({reason}); record it again. {_HOW}") from None


def check_replay_overrides(variant: str, pairs: list[tuple[str, object]], lab=None) -> None:
    """Refuse overrides of ``variant`` that a replay cannot honour, naming them and what it can vary.

    ``algorithm=NAME`` of an algorithm that does not declare the trait replayable is refused on its
    own: replay runs such an algorithm's step. Keys outside every known section are left to the
    config loader's own error.
    """
    if lab is None:
        from rllab import Lab

        lab = Lab()
    known = set(COMPONENT_SECTIONS) | set(PLAIN_SECTIONS) | {"name", "output_dir", "loggers", "schedule"}
    seen: dict[str, str] = {}
    for key, value in pairs:
        same = key[: -len(".name")] if key.endswith(".name") and key[: -len(".name")] in COMPONENT_SECTIONS else key
        if same in seen:
            raise RllabError(
                f"variant {variant!r} sets {same} twice ({seen[same]} and {key}={value!r}): only one would apply. "
                f"Variants are separate words (rllab replay FILE policy_loss=cispo policy_loss=gspo); overrides of one "
                f"variant are joined by commas"
            )
        seen[same] = f"{key}={value!r}"
    refused = []
    for key, value in pairs:
        parts = key.split(".")
        head = parts[0]
        if head == "algorithm" and (len(parts) == 1 or parts[1:] == ["name"]) and not lab.spec("algorithm", str(value)).trait("replayable"):
            able = ", ".join(repr(n) for n in lab.names("algorithm") if lab.spec("algorithm", n).trait("replayable"))
            raise RllabError(
                f"variant {variant!r}: {key}={value!r} — rllab replay supports only the algorithms that declare the trait "
                f"replayable ({able}: a recording holds policy-gradient rollouts and replays their update); vary its knobs "
                f"instead, e.g. algorithm.minibatches=4"
            )
        if head == "algorithm" or head in REPLAY_VARIES or key in REPLAY_VARIES or head not in known:
            continue
        refused.append(key)
    if refused:
        raise RllabError(
            f"variant {variant!r}: rllab replay cannot vary {', '.join(refused)}: it reruns the loss side on the recorded "
            f"batches (the recording's weights, task and samples), which these do not change. It can vary: {varies_text()}. "
            f"To compare anything else, run it: rllab suite (docs/suites.md)"
        )


RECORD_KEEPS = ("model", "task", "env", "backend", "algorithm", "train.seed")
"""What a recording from a run directory takes from the run as it is: it continues from the run's
checkpoint, whose model, task (or environment), backend, algorithm and seed are fixed."""


def check_record_args(source: str | None, *, out: Path, preset: str | None, overrides: Sequence[str] = ()) -> None:
    """Refuse ``rllab record`` options that would be ignored or destroy something.

    ``--preset`` with a run directory (its recorded config is used as it is), an override of what
    a run fixes (:data:`RECORD_KEEPS`) with a run directory, a run directory without a checkpoint
    (the batches would not come from the run's weights), and an ``--out`` that is a directory or
    an existing file other than a recording (it would be replaced).
    """
    if source is not None and Path(source).is_dir() and (Path(source) / "config.toml").is_file():
        from rllab.parallel.checkpoint import latest

        if preset:
            raise RllabError(f"--preset {preset} does not apply to a run directory: {source} is recorded with its own config")
        fixed = [o for o in overrides if _fixed_by_the_run(_override_key(o))]
        if fixed:
            raise RllabError(
                f"rllab record {source} continues that run from its checkpoint, whose {', '.join(RECORD_KEEPS)} are fixed: "
                f"{' '.join(fixed)} cannot apply. To record with them from the config's warm-started model instead: "
                f"rllab record {Path(source) / 'config.toml'} {' '.join(fixed)} --out {out}"
            )
        if latest(Path(source)) is None:
            raise RllabError(
                f"{source} has no checkpoint: the batches would come from the config's warm-started model, not from this "
                f"run's weights. To record from that model on purpose: rllab record {Path(source) / 'config.toml'} --out {out}"
            )
    out = Path(out)
    if out.is_dir():
        raise RllabError(f"--out {out} is a directory; give the recording's file name, e.g. --out {out / 'rec.pt'}")
    if out.is_file() and out.stat().st_size:
        with open(out, "rb") as f:
            head = f.read(len(_ZIP_MAGIC))
        if head != _ZIP_MAGIC:
            raise RllabError(f"--out {out} exists and is not a recording (a config?); recording there would replace it: choose another --out")
        if not _is_recording(out):
            raise RllabError(
                f"--out {out} exists and is not a recording (a training checkpoint, or another torch file); recording there "
                f"would replace it: choose another --out"
            )


def _is_recording(path: Path) -> bool:
    """Whether ``path`` holds a recording (of any format version); its tensors are mapped, not read."""
    import torch

    try:
        data = torch.load(path, weights_only=False, map_location="cpu", mmap=True)
    except Exception:  # unreadable: not a recording to replace
        return False
    return isinstance(data, dict) and "format" in data and "batches" in data
