"""The OpenAI-compatible HTTP API over an ``EngineRunner``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dspark.server.protocol import (
    ChatRequest,
    CompletionRequest,
    chat_body,
    chat_chunk,
    completion_body,
    error_body,
    usage,
)
from dspark.server.runner import EngineRunner, Event, QueueFullError, ShuttingDownError

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


def build_app(
    runner: EngineRunner,
    model_name: str,
    chat_template: Callable[[list[dict]], list[int]],
    encode: Callable[[str], list[int]],
    grace_seconds: float = 30.0,
) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        runner.start()
        yield
        # Normally GracefulServer has drained the runner already; this covers other hosts.
        await asyncio.to_thread(runner.shutdown, grace_seconds)

    app = FastAPI(title="dspark", version="0.1.0", lifespan=lifespan)

    def reject(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        with runner.metrics.lock:
            runner.metrics.rejected[str(status)] += 1
        return JSONResponse(error_body(message, kind), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}"
            for e in error.errors()
        )
        return reject(400, f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(error.detail)), status_code=error.status_code)

    @app.get("/health")
    async def health() -> JSONResponse:
        if runner.accepting:
            return JSONResponse({"status": "ok"})
        status = runner.unavailable or "shutting down"
        return JSONResponse({"status": status}, status_code=503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "dspark"}],
        }

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(runner.metrics.render(), media_type="text/plain; version=0.0.4")

    async def start(body, prompt_ids: list[int]):
        if body.model != model_name:
            return None, reject(
                400,
                f"model {body.model!r} is not served here; use {model_name!r}",
                "invalid_request_error",
            )
        try:
            params = body.sampling_params(DEFAULT_MAX_TOKENS)
            request_id, events = runner.submit(prompt_ids, params)
        except QueueFullError as error:
            return None, reject(429, str(error), "rate_limit_error")
        except ShuttingDownError as error:
            return None, reject(503, str(error), "server_error")
        except ValueError as error:
            return None, reject(400, str(error))
        return (request_id, events), None

    async def respond(body, prompt_ids: list[int], http: Request, make_chunk, make_body):
        """Run one request: stream chunks from ``make_chunk(request_id)``, or wait for the
        whole text and answer with ``make_body``."""
        started, failure = await start(body, prompt_ids)
        if failure is not None:
            return failure
        request_id, events = started
        if body.stream:
            return _sse(runner, request_id, events, make_chunk(request_id), body.include_usage)
        text, final = await _collect(runner, http, request_id, events)
        if final.finish_reason == "error":
            message = final.error or "the request failed"
            return JSONResponse(error_body(message, "server_error"), status_code=500)
        use = usage(final.prompt_tokens, final.completion_tokens)
        return make_body(request_id, model_name, text, final.finish_reason, use)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        def make_chunk(request_id: str) -> Callable:
            return lambda text, finish, use: completion_body(
                request_id, model_name, text, finish, use, chunk=True
            )

        return await respond(body, encode(body.prompt), http, make_chunk, completion_body)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, http: Request):
        def make_chunk(request_id: str) -> Callable:
            is_first = [True]

            def chunk(text: str, finish: str | None, use: dict | None) -> dict:
                # The first delta names the role; later ones carry content only.
                delta = (
                    {"role": "assistant", "content": text}
                    if is_first[0]
                    else ({"content": text} if text else {})
                )
                is_first[0] = False
                return chat_chunk(request_id, model_name, delta, finish, use)

            return chunk

        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        return await respond(body, chat_template(messages), http, make_chunk, chat_body)

    return app


async def _collect(
    runner: EngineRunner, http: Request, request_id: str, events: asyncio.Queue
) -> tuple[str, Event]:
    """All text of a non-streamed request; aborts it if the client goes away."""
    parts = []
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.get(), timeout=0.5)
            except TimeoutError:
                if await http.is_disconnected():
                    runner.abort(request_id)
                    raise
                continue
            parts.append(event.text)
            if event.finish_reason is not None:
                return "".join(parts), event
    except asyncio.CancelledError:
        runner.abort(request_id)
        raise


def _sse(
    runner: EngineRunner,
    request_id: str,
    events: asyncio.Queue,
    chunk: Callable,
    include_usage: bool,
) -> StreamingResponse:
    async def stream() -> AsyncIterator[str]:
        finished = False
        try:
            while True:
                event = await events.get()
                if event.finish_reason == "error" and event.error:
                    finished = True
                    yield _data(error_body(event.error, "server_error"))
                    break
                if event.text or event.finish_reason is None:
                    yield _data(chunk(event.text, None, None))
                if event.finish_reason is not None:
                    finished = True
                    yield _data(chunk("", event.finish_reason, None))
                    if include_usage:
                        body = chunk("", None, usage(event.prompt_tokens, event.completion_tokens))
                        body["choices"] = []
                        yield _data(body)
                    break
        except Exception as error:  # a server bug: tell the client instead of hanging up
            yield _data(error_body(f"internal server error: {error!r}", "server_error"))
        finally:
            if not finished:  # the client disconnected (or the stream broke): free the slot
                runner.abort(request_id)
        yield "data: [DONE]\n\n"

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _data(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"
