"""The `nanoserve` command: serve, generate, convert. Bad input: one line and a non-zero exit."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from nanoserve.core.errors import NanoserveError
from nanoserve.runtime import CheckpointError, EmbeddedModelMissing

if TYPE_CHECKING:
    from nanoserve.api.server.engine_client import EngineFactory
    from nanoserve.api.server.settings import ServerSettings

EXIT_FAILED = 1


def main(argv: Sequence[str] | None = None, *, engine_factory: EngineFactory | None = None) -> int:
    """engine_factory: what `serve` boots (default: the real engine; tests/faults.py's launcher
    gives one that fails on cue)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args, engine_factory)
        if args.command == "generate":
            return _generate(args)
        return _convert(args)
    except (NanoserveError, CheckpointError, EmbeddedModelMissing, OSError, ValueError) as error:
        print(f"nanoserve: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    from nanoserve.api.server.settings import add_options

    parser = argparse.ArgumentParser(
        prog="nanoserve", description="An OpenAI-compatible LLM server."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve a model over the OpenAI API")
    serve.add_argument(
        "model_path",
        nargs="?",
        help="Hugging Face directory or GGUF file (default: embedded SmolLM2)",
    )
    serve.add_argument("--host", default=os.environ.get("NANOSERVE_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("NANOSERVE_PORT", "8000")))
    serve.add_argument("--log-level", default="info")
    add_options(serve, skip=("--model",))
    serve.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        default=None,
        help="when recorded: record lazily, in front of clients",
    )

    generate = commands.add_parser("generate", help="one answer in the terminal")
    generate.add_argument("prompt")
    generate.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the chat template"
    )
    generate.add_argument("--max-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--seed", type=int, default=None)
    add_options(
        generate,
        skip=("--seed", "--api-key", "--max-body-bytes", "--grace-seconds", "--read-timeout"),
    )

    convert = commands.add_parser("convert", help="GGUF file to a Hugging Face directory")
    convert.add_argument("gguf")
    convert.add_argument("out_dir")
    return parser


def serve_settings(args: argparse.Namespace) -> ServerSettings:
    from nanoserve.api.server.settings import ServerSettings, values_from_args

    values = values_from_args(args)
    if getattr(args, "model_path", None):
        values["model"] = args.model_path
    return ServerSettings.from_values(values)


def _check_model(model: str | None) -> None:
    """Fail before the port opens: a path that is not there, or no embedded model."""
    from nanoserve.runtime import embedded_model_path

    if model is None:
        embedded_model_path()
    elif not os.path.exists(model):
        raise CheckpointError(model, "no such file or directory")


def _serve(args: argparse.Namespace, engine_factory: EngineFactory | None) -> int:
    import uvicorn

    from nanoserve.api.app import create_app
    from nanoserve.api.server.engine_client import build_async_engine
    from nanoserve.api.server.http_protocol import KEEP_ALIVE_S, MAX_HEAD_BYTES, protocol_class

    _GracefulServer = _graceful_server_class()
    from nanoserve.api.server.state import ServerState

    settings = serve_settings(args)
    _check_model(settings.engine.model)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    failed: list[BaseException] = []

    config = uvicorn.Config(
        app=None,  # type: ignore[arg-type]  # set below: the app needs the server first
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=max(1, int(settings.grace_seconds)),
        # The limits on a slow or oversized request, each named (README, "Failure behaviour").
        http=protocol_class(settings.read_timeout),
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = _GracefulServer(config)

    def on_failure(error: BaseException) -> None:
        failed.append(error)
        server.should_exit = True

    state = ServerState(
        settings,
        engine_factory=engine_factory or build_async_engine,
        say=lambda line: print(line, flush=True),
        on_boot_failure=on_failure,
    )
    config.app = create_app(server=state)
    server.run()
    if state.booting:
        # A shutdown during one long boot step (a load, a wide CPU recording): the cancel would
        # stop it at the step's end, but the process need not wait, and an interpreter exit
        # with the thread inside torch aborts. Nothing is left to save: leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_FAILED if failed else 0)
    if failed:
        print(f"nanoserve: {failed[0]}", file=sys.stderr)
        # A dead engine may leave its step thread stuck (the watchdog's case): an interpreter
        # exit would join it forever. Nothing is left to save.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_FAILED)
    return 0


def _graceful_server_class() -> type:
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """SIGTERM / Ctrl-C ask for the graceful shutdown; having done it, exit 0 rather than
        re-raise the signal (uvicorn's default, which ends the process with 143)."""

        def handle_exit(self, sig: int, frame: object) -> None:
            super().handle_exit(sig, frame)  # type: ignore[arg-type]
            self._captured_signals.clear()

    return GracefulServer


def _generate(args: argparse.Namespace) -> int:
    from nanoserve.runtime import LLM, SamplingParams, build_engine

    settings = serve_settings(args)
    _check_model(settings.engine.model)
    # Refuse bad sampling flags before the model loads, not after.
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    llm = LLM(engine=build_engine(settings.engine, say=lambda line: print(line, file=sys.stderr)))
    if args.chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params)[0]
    else:
        out = llm.generate(args.prompt, params)[0]
    print(out.outputs[0].text)
    return 0


def _convert(args: argparse.Namespace) -> int:
    from nanoserve.runtime import convert_gguf

    out = convert_gguf(args.gguf, args.out_dir)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
