"""attnlab.cli: every error is one line on stderr and exit status 2, never a traceback (ATTNLAB_DEBUG=1 shows it)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import main, one_line, run_command

ROOT = Path(__file__).resolve().parents[1]


def _attnlab(*argv: str, debug: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("ATTNLAB_DEBUG", None)
    if debug:
        env["ATTNLAB_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "attnlab.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=300)


def _one_error_line(proc: subprocess.CompletedProcess, prefix: str) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def _damaged_model(directory: Path) -> Path:
    from attnlab.models import CausalLM, CausalLMConfig

    CausalLM(CausalLMConfig(vocab_size=9, dim=16, heads=2, layers=1)).save_pretrained(directory)
    (directory / "model.safetensors").write_bytes(b"")
    return directory


def _damaged_run(directory: Path) -> Path:
    step = directory / "checkpoints" / "step_00000004"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text('{"format": "attnlab-checkpoint-1", "st')  # cut off mid-write
    return directory


@pytest.mark.parametrize("argv,prefix,words", [
    (["view", "/missing/ckpt", "text"], "attnlab view: ", ["/missing/ckpt", "not found"]),
    (["analyze", "/missing/ckpt", "text"], "attnlab analyze: ", ["/missing/ckpt"]),
    (["view", "--pretrained", "minilm", "a", "b"], "attnlab view: ", ["exactly one TEXT"]),
    (["bench", "compare", "/missing.json", "/missing2.json"], "attnlab bench: ", ["/missing.json"]),
    (["bench", "compare", "only-one.json"], "attnlab bench: ", ["compare needs two", "got 1"]),
    (["bench", "tasks", "--tasks", "sudoku", "--quiet", "--out", "{tmp}/b"], "attnlab bench: ",
     ["arena task must be one of"]),
    (["view", "{model}", "text"], "attnlab view: ", ["model.safetensors is empty (0 bytes)", "re-save it"]),
    (["train", "copy", "--resume", "--quiet", "--out", "{run}"], "attnlab train: ",
     ["holds no readable checkpoint", "trainer_state.json is not valid JSON"]),
    (["evaluate", "{run}"], "attnlab evaluate: ", ["trainer_state.json is not valid JSON"]),
])
def test_errors_are_one_line_and_exit_2(argv, prefix, words, tmp_path, capsys, monkeypatch):
    """In this process through ``main`` (a new interpreter per case costs seconds each); the first case
    also runs as ``python -m attnlab.cli``, the command a user types."""
    names = {"{tmp}": str(tmp_path), "{model}": str(_damaged_model(tmp_path / "m")) if "{model}" in argv else "",
             "{run}": str(_damaged_run(tmp_path / "r")) if "{run}" in argv else ""}
    for key, value in names.items():
        argv = [a.replace(key, value) for a in argv]
    monkeypatch.delenv("ATTNLAB_DEBUG", raising=False)
    code = main(argv)
    captured = capsys.readouterr()
    line = _one_error_line(subprocess.CompletedProcess(argv, code, captured.out, captured.err), prefix)
    if argv[:2] == ["view", "/missing/ckpt"]:
        assert _one_error_line(_attnlab(*argv), prefix) == line
    for w in words:
        assert w in line, line


def test_debug_shows_the_traceback():
    proc = _attnlab("bench", "compare", "/missing.json", "/missing2.json", debug=True)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "ValueError: cannot read" in proc.stderr


def test_main_returns_2_for_bench_errors(tmp_path, capsys):
    """``attnlab bench`` raises ValueError; main() prints one line and returns 2."""
    assert main(["bench", "tasks", "--tasks", "sudoku", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab bench: arena task must be one of") and err.count("\n") == 1


def test_a_subcommand_module_that_fails_to_import_is_one_line_naming_it(monkeypatch, capsys):
    import attnlab.cli as cli_mod

    monkeypatch.delenv("ATTNLAB_DEBUG", raising=False)
    monkeypatch.setitem(sys.modules, "attnlab.deploy.cli", None)  # importing it now raises ImportError
    assert cli_mod.main(["info"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: the subcommands of attnlab failed to import") and "attnlab.deploy.cli" in err
    assert err.count("\n") == 1


def _namespace(exc: BaseException) -> argparse.Namespace:
    def func(args):
        raise exc

    return argparse.Namespace(command="demo", func=func)


@pytest.mark.parametrize("exc,status,line", [
    (ValueError("bad value\n  second line"), 2, "attnlab demo: bad value; second line"),
    (FileNotFoundError(2, "No such file or directory", "x.json"), 2,
     "attnlab demo: [Errno 2] No such file or directory: 'x.json'"),
    (ImportError("needs matplotlib: pip install matplotlib"), 2, "attnlab demo: needs matplotlib: pip install matplotlib"),
    (FloatingPointError("loss became nan at step 3"), 2, "attnlab demo: loss became nan at step 3"),
    (KeyboardInterrupt(), 130, "attnlab demo: interrupted"),
    (RuntimeError("boom"), 2, "attnlab demo: RuntimeError: boom (a bug? ATTNLAB_DEBUG=1 shows the traceback)"),
    (ValueError(), 2, "attnlab demo: ValueError"),
])
def test_run_command_turns_each_error_into_one_line(exc, status, line, capsys, monkeypatch):
    monkeypatch.delenv("ATTNLAB_DEBUG", raising=False)
    assert run_command(_namespace(exc)) == status
    assert capsys.readouterr().err == line + "\n"
    monkeypatch.setenv("ATTNLAB_DEBUG", "1")
    with pytest.raises(type(exc)):
        run_command(_namespace(exc))


def test_status_exits_pass_through(capsys):
    with pytest.raises(SystemExit) as e:  # argparse's own errors keep argparse's usage line and status 2
        main(["train", "no-such-task"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        run_command(_namespace(SystemExit(3)))
    assert e.value.code == 3


def test_one_line():
    assert one_line("a\n\n  b  \nc") == "a; b; c" and one_line("") == ""
