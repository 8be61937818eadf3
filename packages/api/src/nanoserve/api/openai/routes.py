"""POST /v1/completions and /v1/chat/completions, streaming or not; GET /v1/models.

Handlers only: translate the request (chat/engine_inputs.py), submit it (chat/merged_stream.py), and hand
the deltas to the streamed (sse.py) or whole (response_builders.py) answer. Each prompt x
sample is one engine sequence; deltas of several prompts are merged into one stream. Leaving a
stream early (a client gone) closes the engine iterators, which aborts their requests and frees
their blocks; a client that leaves before a non-streamed answer is ready does the same
(`MergedStream.drain`).
"""

from __future__ import annotations

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import ServerSentEvent

from nanoserve.api.chat.engine_inputs import translate_chat, translate_completion
from nanoserve.api.chat.merged_stream import MergedStream, submit_chat
from nanoserve.api.chat.response_builders import Answer, chat_response, completion_response
from nanoserve.api.chat.schemas import ChatRequest, CompletionRequest, ModelCard, ModelList
from nanoserve.api.openai.sse import chat_events, completion_events
from nanoserve.api.server.admission import admit
from nanoserve.api.server.errors import APIError
from nanoserve.api.server.state import ServerState
from nanoserve.runtime import RequestError


class OpenAIController(Controller):
    path = "/v1"
    before_request = staticmethod(admit)

    @get("/models")
    async def models(self, server: NamedDependency[ServerState]) -> ModelList:
        engine = server.require_engine()
        card = ModelCard(
            id=engine.name,
            created=int(server.started),
            max_model_len=engine.max_model_len,
            task=engine.status().task,
        )
        return ModelList(data=[card])

    @post("/completions", status_code=200)
    async def completions(
        self,
        request: Request,
        data: JSONBody[CompletionRequest],
        server: NamedDependency[ServerState],
    ) -> Response:
        engine = server.require_engine()
        inputs = translate_completion(data, engine)
        if inputs.params.grammar is not None:
            await engine.compile_grammar(inputs.params.grammar)
        answer = Answer.new("cmpl", engine)
        # One engine request per prompt, each running params.n samples.
        requests = [(f"{answer.id}-{i}", p.token_ids) for i, p in enumerate(inputs.prompts)]
        timeout = server.settings.request_timeout
        try:
            merged = await MergedStream.submit(engine, requests, inputs.params, timeout=timeout)
        except RequestError as error:
            if error.field == "n" and inputs.best_of > inputs.n:  # the samples are best_of's
                raise APIError(400, f"best_of: {error}", param="best_of") from None
            raise
        if data.stream:
            return ServerSentEvent(completion_events(answer, inputs, merged))
        return Response(completion_response(answer, inputs, await merged.drain(request)))

    @post("/chat/completions", status_code=200)
    async def chat(
        self, request: Request, data: JSONBody[ChatRequest], server: NamedDependency[ServerState]
    ) -> Response:
        engine = server.require_engine()
        inputs = translate_chat(data, engine)
        answer = Answer.new("chatcmpl", engine)
        merged = await submit_chat(engine, answer.id, inputs, server.settings.request_timeout)
        if data.stream:
            return ServerSentEvent(chat_events(answer, inputs, merged))
        return Response(chat_response(answer, inputs, await merged.drain(request)))


__all__ = ["OpenAIController"]
