"""ServerSettings: one table of options for flags and NANOSERVE_* variables; `--capture` is
`--decode-mode recorded`, and the two may not contradict each other."""

from __future__ import annotations

import argparse
import os

import pytest

from nanoserve.api.cli import EXIT_FAILED, main
from nanoserve.api.server.settings import (
    ServerSettings,
    add_options,
    values_from_args,
    values_from_env,
)
from nanoserve.runtime.engine.config.engine_config import (
    DecodeMode,
    EngineConfigError,
    ResolvedConfig,
)
from nanoserve.runtime.engine.config.speculative_config import SpeculativeConfig


def settings(*argv: str) -> ServerSettings:
    parser = argparse.ArgumentParser()
    add_options(parser)
    return ServerSettings.from_values(values_from_args(parser.parse_args(list(argv))))


@pytest.mark.parametrize(
    ("argv", "mode"),
    [
        ((), DecodeMode.EAGER),
        (("--capture",), DecodeMode.RECORDED),
        (("--capture", "1"), DecodeMode.RECORDED),
        (("--capture", "0"), DecodeMode.EAGER),
        (("--decode-mode", "bucketed"), DecodeMode.BUCKETED),
        (("--decode-mode", "persistent"), DecodeMode.PERSISTENT),
        (("--decode-mode", "recorded", "--capture"), DecodeMode.RECORDED),
    ],
)
def test_decode_mode_from_flags(argv: tuple[str, ...], mode: DecodeMode) -> None:
    assert settings(*argv).engine.decode_mode == mode


def test_decode_mode_from_the_environment() -> None:
    env = ServerSettings.from_env({"NANOSERVE_DECODE_MODE": "persistent"})
    assert env.engine.decode_mode == DecodeMode.PERSISTENT
    assert (
        ServerSettings.from_env({"NANOSERVE_CAPTURE": "1"}).engine.decode_mode
        == DecodeMode.RECORDED
    )


def test_capture_and_another_mode_contradict() -> None:
    with pytest.raises(
        EngineConfigError,
        match=r"^--capture means --decode-mode recorded; --decode-mode bucketed contradicts it$",
    ):
        settings("--capture", "--decode-mode", "bucketed")


def test_an_unknown_mode_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--decode-mode", "recordings", "--port", "1"]) == EXIT_FAILED
    assert capsys.readouterr() == (
        "",
        "nanoserve: decode_mode must be one of eager, bucketed, persistent, recorded,"
        " got 'recordings'\n",
    )


def test_speculation_from_flags_and_the_environment() -> None:
    assert settings().engine.speculative is None
    assert settings("--speculative-config", "ngram").engine.speculative == SpeculativeConfig()
    json_flag = '{"method": "ngram", "num_speculative_tokens": 3}'
    assert settings("--speculative-config", json_flag).engine.speculative == SpeculativeConfig(
        num_speculative_tokens=3
    )
    env = ServerSettings.from_env({"NANOSERVE_SPECULATIVE_CONFIG": "ngram"})
    assert env.engine.speculative == SpeculativeConfig()


def test_a_bad_speculative_config_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--speculative-config", "eagle", "--port", "1"])
    assert exited.value.code == 2  # argparse's usage error
    err = capsys.readouterr().err.splitlines()
    assert err[-1].endswith(
        "argument --speculative-config: speculative method must be one of ngram, draft_model,"
        " got 'eagle'"
    )


def test_a_draft_model_from_its_flag_or_the_json() -> None:
    draft = SpeculativeConfig(method="draft_model", model="d.gguf", num_speculative_tokens=5)
    assert settings("--draft-model", "d.gguf").engine.speculative == draft
    assert ServerSettings.from_env({"NANOSERVE_DRAFT_MODEL": "d.gguf"}).engine.speculative == draft
    json_flag = '{"model": "d.gguf", "num_speculative_tokens": 3}'  # a model: draft_model
    three = SpeculativeConfig(method="draft_model", model="d.gguf", num_speculative_tokens=3)
    assert settings("--speculative-config", json_flag).engine.speculative == three
    both = settings("--speculative-config", json_flag, "--draft-model", "d.gguf")
    assert both.engine.speculative == three


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--speculative-config", "ngram", "--draft-model", "d.gguf"),
            "--draft-model d.gguf contradicts --speculative-config's ngram",
        ),
        (
            ("--speculative-config", '{"model": "e.gguf"}', "--draft-model", "d.gguf"),
            "--draft-model d.gguf contradicts --speculative-config's draft_model e.gguf",
        ),
    ],
)
def test_a_draft_model_that_contradicts_the_config_is_one_line(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *argv, "--port", "1"]) == EXIT_FAILED
    assert capsys.readouterr().err == f"nanoserve: {message}\n"


def test_the_environment_is_parsed_in_one_place() -> None:
    assert values_from_env({"NANOSERVE_MAX_BATCH": "8", "UNRELATED": "x"}) == {"max_batch": 8}
    with pytest.raises(EngineConfigError, match=r"^NANOSERVE_KV_BUDGET: 'lots' is not a size"):
        values_from_env({"NANOSERVE_KV_BUDGET": "lots"})


def test_a_server_picks_its_forms_by_checkpoint_and_cpu() -> None:
    from nanoserve.runtime.kernels.cpu_features import cpu_features

    def resolved(*argv: str) -> ResolvedConfig:
        return settings(*argv).engine.resolve(model_max_len=4096, auto_quantize="gguf")

    engine = settings().engine
    assert (engine.quantize, engine.dtype) == ("auto", "auto")  # resolved at boot
    assert (resolved().quantize, resolved().dtype) == ("gguf", "bfloat16")
    dense = resolved("--quantize", "none")
    assert (dense.quantize, dense.dtype) == (None, cpu_features().auto_dtype())
    assert resolved("--quantize", "q4").dtype == "bfloat16"
    assert resolved("--quantize", "q4", "--dtype", "float32").dtype == "float32"


def test_threads_from_the_flag_the_environment_or_the_cpus_available() -> None:
    assert settings().engine.threads == "auto"  # the server's default: the affinity mask
    assert settings("--threads", "3").engine.threads == 3
    assert ServerSettings.from_env({"NANOSERVE_THREADS": "1"}).engine.threads == 1
    resolved = settings().engine.resolve(model_max_len=64)
    assert resolved.threads == len(os.sched_getaffinity(0))
    assert settings("--threads", "5").engine.resolve(model_max_len=64).threads == 5


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_a_thread_count_below_one_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--threads", value, "--port", "1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    reason = (
        f"{value!r} is not auto or a number of threads"
        if value == "two"
        else f"{value!r}: a server needs at least 1 thread"
    )
    assert err.splitlines()[-1] == f"nanoserve serve: error: argument --threads: {reason}"


def test_a_bad_thread_count_in_the_environment_is_named() -> None:
    with pytest.raises(EngineConfigError, match="NANOSERVE_THREADS: '0': a server needs at least"):
        ServerSettings.from_env({"NANOSERVE_THREADS": "0"})


def test_the_kv_cache_dtype_from_its_flag_or_the_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert settings().engine.kv_cache_dtype == "auto"
    assert settings("--kv-cache-dtype", "Q8_0").engine.kv_cache_dtype == "q8_0"
    pair = settings("--kv-cache-dtype", "k=q8_0,v=q4_0").engine
    assert pair.kv_cache_dtype == "k=q8_0,v=q4_0"
    env = ServerSettings.from_env({"NANOSERVE_KV_CACHE_DTYPE": "q4_0"})
    assert env.engine.kv_cache_dtype == "q4_0"
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--kv-cache-dtype", "fp8", "--port", "1"])
    assert exited.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(
            "argument --kv-cache-dtype: 'fp8' is not a K/V form; choose auto, float32, bfloat16,"
            " float16, q8_0, q4_0, or k=<form>,v=<form>"
        )
    )
