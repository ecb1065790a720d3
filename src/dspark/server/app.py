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
        return JSONResponse({"status": "shutting down"}, status_code=503)

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

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        started, failure = await start(body, encode(body.prompt))
        if failure is not None:
            return failure
        request_id, events = started
        if body.stream:

            def chunk(event: Event | None, text: str, finish: str | None, use: dict | None) -> dict:
                return completion_body(request_id, model_name, text, finish, use, chunk=True)

            return _sse(runner, http, request_id, events, chunk, body.include_usage)
        text, final = await _collect(runner, http, request_id, events)
        if final.error and final.finish_reason == "error":
            return JSONResponse(error_body(final.error, "server_error"), status_code=500)
        return completion_body(
            request_id,
            model_name,
            text,
            final.finish_reason,
            usage(final.prompt_tokens, final.completion_tokens),
        )

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, http: Request):
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        started, failure = await start(body, chat_template(messages))
        if failure is not None:
            return failure
        request_id, events = started
        if body.stream:
            first = [True]

            def chunk(event: Event | None, text: str, finish: str | None, use: dict | None) -> dict:
                delta = (
                    {"role": "assistant", "content": text}
                    if first[0]
                    else ({"content": text} if text else {})
                )
                first[0] = False
                return chat_chunk(request_id, model_name, delta, finish, use)

            return _sse(runner, http, request_id, events, chunk, body.include_usage)
        text, final = await _collect(runner, http, request_id, events)
        if final.error and final.finish_reason == "error":
            return JSONResponse(error_body(final.error, "server_error"), status_code=500)
        return chat_body(
            request_id,
            model_name,
            text,
            final.finish_reason,
            usage(final.prompt_tokens, final.completion_tokens),
        )

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
    http: Request,
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
                    yield _data(chunk(event, event.text, None, None))
                if event.finish_reason is not None:
                    finished = True
                    yield _data(chunk(event, "", event.finish_reason, None))
                    if include_usage:
                        body = chunk(
                            event, "", None, usage(event.prompt_tokens, event.completion_tokens)
                        )
                        body["choices"] = []
                        yield _data(body)
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client disconnected: free the slot within a step
                runner.abort(request_id)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _data(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"
