"""HTTP errors in OpenAI's format: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from pydantic import ValidationError


class ApiError(Exception):
    """A request the server refuses; the app's handler turns it into a JSON response."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.code, self.param)


def error_body(
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def invalid_request(error: ValidationError) -> ApiError:
    """A 400 naming every field pydantic refused (``messages[0].content: ...``)."""
    problems, params = [], []
    for item in error.errors(include_url=False):
        if item["type"] == "json_invalid":
            hint = " (strings must be valid Unicode: no lone surrogates)"
            detail = item.get("ctx", {}).get("error", item["msg"])
            suffix = hint if "escape" in str(detail) or "surrogate" in str(detail) else ""
            problems.append(f"the body is not valid JSON: {detail}{suffix}")
            continue
        param = _field_path(item["loc"])
        params.append(param)
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{param or 'body'}: {message}")
    param = next((p for p in params if p), None)
    return ApiError(400, "invalid request: " + "; ".join(problems), param=param)


def _field_path(loc: tuple) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path
