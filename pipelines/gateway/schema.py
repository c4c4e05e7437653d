"""The gateway's OpenAPI schema: what each endpoint takes and answers, for the HTTP reference page and for the
fuzz tests that generate requests from it.

The handlers read and validate their bodies themselves (`openai_api.decode_body`, `parse_request`: a size limit
while reading, OpenAI-shaped 400s), so FastAPI never parses them; the request bodies are declared here, from the
same pydantic models, and added to the schema FastAPI builds from the routes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from pipelines.gateway.openai_api import ChatCompletionRequest

COMPONENTS = "#/components/schemas/{model}"


class FeedbackRequest(BaseModel):
    """A caller's rating of one answer (the completion's id, as the gateway returned it)."""

    id: str = Field(pattern=r"^chatcmpl-", description="the `id` of the chat completion being rated")
    rating: Literal["up", "down", "none"] = Field(description="up, down, or none (withdraws an earlier rating)")


class ErrorDetail(BaseModel):
    message: str = Field(description="what is wrong, in one line")
    type: str = Field(description="invalid_request_error, rate_limit_error, server_error, ...")
    param: str | None = Field(None, description="the request field at fault, if one is")
    code: str | None = Field(None, description="a stable code: invalid_api_key, rate_limit_exceeded, ...")


class ErrorBody(BaseModel):
    """Every error the gateway answers, in OpenAI's shape."""

    error: ErrorDetail


BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/feedback": FeedbackRequest,
}


def _error(description: str) -> dict[str, Any]:
    ref = {"$ref": COMPONENTS.format(model="ErrorBody")}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


ERRORS = {
    "400": _error("the request is not valid (OpenAI's error shape names the field)"),
    "401": _error("no key, or a key the gateway does not know"),
    "413": _error("the body is larger than gateway.max_request_bytes"),
    "429": _error("a limit was reached (the project's quota, the gateway's places, its turn): retry after"),
    "503": _error("the model server is down or the model not loaded: retry"),
}
PROBES = ("/health", "/livez", "/ready")


def openapi(app: Any) -> dict[str, Any]:
    """FastAPI's schema of the routes, with the request bodies, the error responses, the components and the
    bearer-key security scheme added (built once per app)."""
    from fastapi.openapi.utils import get_openapi

    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    models: list[type[BaseModel]] = [ErrorBody, *BODIES.values()]
    for model in models:
        found = model.model_json_schema(ref_template=COMPONENTS)
        components.update(found.pop("$defs", {}))
        components[model.__name__] = found
    schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, methods in schema.get("paths", {}).items():
        for operation in methods.values():
            if path in BODIES:
                ref = {"$ref": COMPONENTS.format(model=BODIES[path].__name__)}
                operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
            if path not in PROBES:
                operation["security"] = [{"bearer": []}]
                operation["responses"].update({k: v for k, v in ERRORS.items() if k != "413" or path in BODIES})
    app.openapi_schema = schema
    return schema
