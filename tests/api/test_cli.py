"""The CLI's answers to bad input, in-process: one line on stderr, a non-zero exit, no
traceback, and nothing loaded or bound first. (That `python -m nanoserve.api.cli` turns the
same answers into the process's exit: test_launch.py, one process each.)"""

from __future__ import annotations

import os

import pytest

from nanoserve.api.cli import EXIT_FAILED, main


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's NANOSERVE_* settings must not leak in."""
    for name in [n for n in os.environ if n.startswith("NANOSERVE_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("serve", "--max-batch", "0"), "nanoserve: max_batch must be a positive integer, got 0"),
        (
            ("serve", "--dtype", "float8"),
            "nanoserve: dtype must be one of auto, bfloat16, float16, float32, got 'float8'",
        ),
        (
            ("generate", "hi", "--max-tokens", "0"),
            "nanoserve: max_tokens: must be an integer >= 1, got 0",
        ),
        (
            ("generate", "hi", "--temperature", "9"),
            "nanoserve: temperature: must be in [0, 2], got 9.0",
        ),
    ],
    ids=["zero", "dtype", "max-tokens", "temperature"],
)
def test_bad_values_are_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    argv = [*args, "--port", "1"] if args[0] == "serve" else list(args)
    assert main(argv) == EXIT_FAILED
    out, err = capsys.readouterr()
    assert (out, err) == ("", message + "\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--max-batch", "zero"), "argument --max-batch: invalid int value: 'zero'"),
        (
            ("--kv-budget", "lots"),
            "argument --kv-budget: 'lots' is not a size (try 512MiB, 1GB or a number of bytes)",
        ),
        (
            ("--kv-events-config", '{"endpont": 1}'),
            "argument --kv-events-config: unknown key 'endpont' (known:"
            " enable_kv_cache_events, publisher, endpoint, replay_endpoint, buffer_steps, hwm,"
            " max_queue_size, topic, event_format)",
        ),
    ],
    ids=["int", "size", "kv-events"],
)
def test_unparsable_flags_are_usage_errors(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", *args, "--port", "1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: nanoserve serve ") and "Traceback" not in err
    assert err.splitlines()[-1] == f"nanoserve serve: error: {message}"


def test_bad_env_var_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOSERVE_MAX_BATCH", "many")
    assert main(["serve", "--port", "1"]) == EXIT_FAILED
    assert capsys.readouterr().err == (
        "nanoserve: NANOSERVE_MAX_BATCH: invalid literal for int() with base 10: 'many'\n"
    )
