"""The OpenAI-compatible HTTP API over an ``EngineRunner``.

The event loop only moves bytes: a body is read up to its size limit, then parsed,
validated and tokenized in a worker thread, so one large request cannot stall the others
(``/health`` included). A client that goes away, streamed or not, has its request aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from dspark.engine.sampling import SamplingParams
from dspark.server.cli import DEFAULT_MAX_BODY_BYTES
from dspark.server.errors import ApiError, error_body, invalid_request
from dspark.server.prompts import PromptEncoder
from dspark.server.protocol import (
    ChatRequest,
    CompletionRequest,
    chat_body,
    chat_chunk,
    completion_body,
    usage,
)
from dspark.server.runner import EngineRunner, Event, QueueFullError, ShuttingDownError

log = logging.getLogger("dspark.server")

RETRY_AFTER_SECONDS = 1  # a slot frees within a few steps under load


class _GuardedRoute(APIRoute):
    """Any exception a handler did not expect becomes a JSON 500 with a request id; the
    traceback goes to the log under that id, never to the client."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (ApiError, StarletteHTTPException, RequestValidationError):
                raise
            except ClientDisconnect:  # gone before its body arrived: nobody to answer
                log.info("client left %s before sending its whole body", request.url.path)
                return Response(status_code=499)
            except Exception:
                request_id = f"req-{uuid.uuid4().hex[:16]}"
                log.exception("unexpected error in %s (request %s)", request.url.path, request_id)
                body = error_body(
                    f"internal server error (request id {request_id})", "server_error"
                )
                return JSONResponse(body, status_code=500, headers={"x-request-id": request_id})

        return guarded


def build_app(
    runner: EngineRunner,
    model_name: str,
    encoder: PromptEncoder,
    grace_seconds: float = 30.0,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        runner.start()
        yield
        # Normally GracefulServer has drained the runner already; this covers other hosts.
        await asyncio.to_thread(runner.shutdown, grace_seconds)

    app = FastAPI(title="dspark", version="0.1.0", lifespan=lifespan)
    app.router.route_class = _GuardedRoute

    def count_rejected(status: int) -> None:
        with runner.metrics.lock:
            runner.metrics.rejected[str(status)] += 1

    @app.exception_handler(ApiError)
    async def _refused(_: Request, error: ApiError) -> JSONResponse:
        count_rejected(error.status)
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        count_rejected(400)
        return JSONResponse(error_body(f"invalid request: {error.errors()}"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(error.detail)), status_code=error.status_code)

    def authorize(http: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = http.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), api_key.encode()
        ):
            raise ApiError(
                401,
                "missing or incorrect API key: send the header 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )

    guarded = [Depends(authorize)]

    @app.get("/health")
    async def health() -> JSONResponse:
        if runner.accepting:
            return JSONResponse({"status": "ok"})
        status = runner.unavailable or "shutting down"
        return JSONResponse({"status": status}, status_code=503)

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "dspark"}],
        }

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(runner.metrics.render(), media_type="text/plain; version=0.0.4")

    def prepare(kind: type, raw: bytes) -> tuple:
        """Parse, validate and tokenize a body (in a worker thread): the request, its
        prompt ids and sampling parameters, or an ``ApiError``."""
        try:
            body = kind.model_validate_json(raw)
        except ValidationError as error:
            raise invalid_request(error) from None
        if body.model != model_name:
            raise ApiError(
                404,
                f"the model {body.model!r} does not exist; this server serves {model_name!r}",
                param="model",
                code="model_not_found",
            )
        if isinstance(body, ChatRequest):
            ids = encoder.chat([m.for_template() for m in body.messages])
        else:
            ids = encoder.completion(body.prompt)
        return body, ids, body.sampling_params(_max_tokens(body, len(ids), encoder.max_model_len))

    async def respond(http: Request, kind: type, id_prefix: str, make_chunk, make_body):
        """Run one request: stream chunks from ``make_chunk(request_id)``, or wait for the
        whole text and answer with ``make_body``."""
        raw = await _read_body(http, max_body_bytes)
        body, ids, params = await asyncio.to_thread(prepare, kind, raw)
        request_id, events = _submit(runner, ids, params, id_prefix)
        if body.stream:
            return _sse(runner, request_id, events, make_chunk(request_id), body.include_usage)
        text, final = await _collect(runner, http, request_id, events)
        if final.finish_reason == "error":
            message = final.error or "the request failed"
            return JSONResponse(error_body(message, "server_error"), status_code=500)
        use = usage(final.prompt_tokens, final.completion_tokens)
        return make_body(request_id, model_name, text, final.finish_reason, use)

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(http: Request):
        def make_chunk(request_id: str) -> Callable:
            return lambda text, finish, use: completion_body(
                request_id, model_name, text, finish, use, chunk=True
            )

        return await respond(http, CompletionRequest, "cmpl", make_chunk, completion_body)

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat(http: Request):
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

        return await respond(http, ChatRequest, "chatcmpl", make_chunk, chat_body)

    return app


def _max_tokens(body, num_prompt: int, max_model_len: int) -> int:
    """The request's limit: what it asked for, or the rest of the context."""
    room = max_model_len - num_prompt
    asked = body.requested_max_tokens
    if asked is None:
        return room
    if asked > room:
        field = "max_tokens" if body.max_tokens is not None else "max_completion_tokens"
        raise ApiError(
            400,
            f"{field} is {asked}, but the context of {max_model_len} tokens leaves "
            f"{room} after the prompt's {num_prompt}",
            param=field,
            code="context_length_exceeded",
        )
    return asked


async def _read_body(http: Request, limit: int) -> bytes:
    """The body, or a 413 past ``limit`` bytes. An oversized body is still read to its
    end (and dropped) so that the client, still sending, gets the 413 instead of a reset."""
    declared = http.headers.get("content-length", "")
    is_too_big = declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        is_too_big = is_too_big or size > limit
        if not is_too_big:
            chunks.append(chunk)
    if is_too_big:
        raise ApiError(
            413,
            f"the request body is larger than {limit} bytes (the server's --max-body-bytes)",
            code="request_too_large",
        )
    return b"".join(chunks)


def _submit(
    runner: EngineRunner, ids: list[int], params: SamplingParams, id_prefix: str
) -> tuple[str, asyncio.Queue]:
    try:
        return runner.submit(ids, params, id_prefix)
    except QueueFullError as error:
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        raise ApiError(429, str(error), "rate_limit_error", headers=headers) from None
    except ShuttingDownError as error:
        raise ApiError(503, str(error), "server_error") from None
    except ValueError as error:
        raise ApiError(400, str(error)) from None


async def _collect(
    runner: EngineRunner, http: Request, request_id: str, events: asyncio.Queue
) -> tuple[str, Event]:
    """All text of a non-streamed request; aborts it as soon as the client goes away."""

    async def abort_on_disconnect() -> None:
        # The body is read, so the next ASGI message is the disconnect.
        while (await http.receive())["type"] != "http.disconnect":
            pass
        runner.abort(request_id)

    watcher = asyncio.create_task(abort_on_disconnect())
    parts = []
    try:
        while True:
            event = await events.get()
            parts.append(event.text)
            if event.finish_reason is not None:
                return "".join(parts), event
    except asyncio.CancelledError:
        runner.abort(request_id)
        raise
    finally:
        watcher.cancel()


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
        except Exception:  # a server bug: tell the client instead of hanging up
            log.exception("stream of request %s failed", request_id)
            message = f"internal server error (request id {request_id})"
            yield _data(error_body(message, "server_error"))
        finally:
            if not finished:  # the client disconnected (or the stream broke): free the slot
                runner.abort(request_id)
        yield "data: [DONE]\n\n"

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _data(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"
