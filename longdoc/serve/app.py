"""The web application of `longdoc serve`: the page (static files) and the HTTP API, on FastAPI.

Routes (the OpenAPI description is at /api/openapi.json):
- `GET /`: the page; `GET /static/...`: its files (plain HTML, CSS and JavaScript; nothing is
  loaded from another machine, and the Content-Security-Policy forbids it);
- `GET /api/info`: what is served (asking or browsing, and about what);
- asking (`longdoc serve DOCS...`): `POST /api/ask`, `GET /api/documents` (the documents, their
  sizes and index state), `GET /api/documents/{file}` (one document's text, by the name it is
  listed under; any other name is 404: nothing else on the machine can be reached);
- browsing (`longdoc serve --task ...`): `GET /api/examples`, `GET /api/examples/{id}`;
- an attention analysis (`longdoc serve --analysis DIR`): `GET /api/analysis` (its analysis.json),
  `GET /api/analysis/plots/{name}` (a PNG it lists; any other name is 404).

Errors are JSON objects {"error": message, "field": the request field at fault or null} with a
4xx status: 400 for a body that is not JSON, 404 for an unknown document or example, 413 for a
body over 1 MB, 422 for a field that is missing, of the wrong type, out of range or unknown, 503
while the documents are being indexed, and where the documents cannot be answered from (their corpus
index damaged while the server reads it: the line `longdoc ask` prints, naming the file). The server answers the next request as usual.
"""

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from longdoc.errors import InputError
from longdoc.serve.analysis import AnalysisFolder
from longdoc.serve.asking import AskService, NotReady
from longdoc.serve.browser import PredictionBrowser
from longdoc.serve.options import AskOptions

STATIC = Path(__file__).parent / "static"
MAX_BODY_BYTES = 1 << 20
SECURITY_HEADERS = [
    # Everything the page uses comes from this server; no framing by other sites.
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class ErrorBody(BaseModel):
    error: str
    field: str | None


def error_response(status: int, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status)


def _host_name(host: str) -> str:
    """A Host header without its port ("[::1]:8000" -> "::1")."""
    if host.startswith("["):
        return host[1:host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class RequestGuard:
    """ASGI middleware, before any route: refuses a Host header that is not allowed (400) and a
    request body over `limit` bytes (413; the body is read here, at most `limit` bytes, then handed
    on), and adds the security headers to every response."""

    def __init__(self, app, allowed_hosts: tuple[str, ...] = ("*",), limit: int = MAX_BODY_BYTES):
        self.app, self.limit = app, limit
        self.hosts = None if "*" in allowed_hosts else {_host_name(host) for host in allowed_hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def secured_send(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if self.hosts is not None and _host_name(host) not in self.hosts:
            return await error_response(400, f"this server answers for {', '.join(sorted(self.hosts))}, not for the "
                                             f"host {host!r}", "host")(scope, receive, secured_send)
        length = headers.get(b"content-length")
        too_large = error_response(413, f"the request body is over {self.limit >> 20} MB ({self.limit} bytes)", "body")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await too_large(scope, receive, secured_send)
        body, more = bytearray(), scope["method"] not in ("GET", "HEAD")
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await too_large(scope, receive, secured_send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, secured_send)


def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    problems = error.errors()
    first = problems[0] if problems else {"loc": ("body",), "msg": "invalid request", "type": ""}
    where = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return error_response(400, f"the request body is not valid JSON ({first.get('ctx', {}).get('error', '')})",
                              "body")
    field = where[0] if where else "body"
    if not where:
        message = 'the body must be one JSON object {"question": ..., options by name}, sent as application/json'
    elif first.get("type") == "extra_forbidden":
        known = ", ".join(AskOptions.model_fields)
        message = f"{field}: not an option of ask; the options are: {known}"
    else:
        message = f"{field}: {first.get('msg', 'invalid')}"
    return error_response(422, message, field)


def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    message = error.detail if isinstance(error.detail, str) else "error"
    if error.status_code == 404 and message == "Not Found":
        message = f"not found: {request.url.path}"
    return error_response(error.status_code, message)


def _server_error(request: Request, error: Exception) -> JSONResponse:
    return error_response(500, f"internal error: {type(error).__name__}: {error}")


ERRORS = {code: {"model": ErrorBody} for code in (400, 404, 413, 422, 503)}


def create_app(*, asking: AskService | None = None, browser: PredictionBrowser | None = None,
               analysis: AnalysisFolder | None = None, allowed_hosts: tuple[str, ...] = ("*",)) -> FastAPI:
    """The application for one set of documents (`asking`), one gold file and its runs (`browser`) or
    one attention analysis (`analysis`).
    `allowed_hosts`: the Host headers answered (others get 400): the loopback names when bound to
    loopback, so that a web page cannot reach the server through a DNS name rebound to 127.0.0.1."""
    from importlib.metadata import version

    app = FastAPI(title="longdoc", version=version("longdoc"), openapi_url="/api/openapi.json",
                  docs_url=None, redoc_url=None,  # their pages load scripts from a CDN
                  description="Ask your documents, or browse a model's predictions beside the gold.")
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _server_error)
    app.add_middleware(RequestGuard, allowed_hosts=allowed_hosts)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/api/info", summary="what this server serves")
    def info() -> dict:
        if browser is not None:
            return browser.info()
        if analysis is not None:
            return analysis.info()
        return {"mode": "ask", "documents": len(asking.documents), "model": None if asking.model_dir is None
                else str(asking.model_dir), "defaults": AskOptions(question="?").model_dump(exclude={"question"})}

    if asking is not None:
        @app.post("/api/ask", summary="answer a question: the object `longdoc ask --json` prints", responses=ERRORS)
        async def ask(options: AskOptions) -> JSONResponse:
            try:
                return JSONResponse(await asking.ask(options))
            except NotReady as error:
                return JSONResponse({"error": str(error), "field": None}, status_code=503,
                                    headers={"Retry-After": "2"})
            except InputError as error:  # the documents or their index, not the request: ask's one line
                return error_response(503, str(error))

        @app.get("/api/documents", summary="the documents served, their sizes and index state")
        def documents() -> dict:
            return asking.status()

        @app.get("/api/documents/{file:path}", summary="one document's text (what answer offsets count in)",
                 responses=ERRORS)
        def document(file: str) -> JSONResponse:
            source = asking.text(file)
            if source is None:
                return error_response(404, f"no served document is named {file!r}", "file")
            return JSONResponse({"file": source.path, "text": source.text, "extracted_from": source.extracted_from})

    if browser is not None:
        @app.get("/api/examples", summary="every example of the gold, with its figures against each run")
        def examples() -> dict:
            return {"task": browser.task.name, "runs": [run.name for run in browser.runs],
                    "metric_keys": list(browser.examples.metric_keys), "examples": browser.rows_json()}

        @app.get("/api/examples/{example_id:path}", summary="one example in full", responses=ERRORS)
        def example(example_id: str) -> JSONResponse:
            found = browser.example_json(example_id)
            if found is None:
                return error_response(404, f"no example with id {example_id!r} in {browser.gold}", "id")
            return JSONResponse(found)

    if analysis is not None:
        @app.get("/api/analysis", summary="the analysis.json of `longdoc analyze attention`")
        def analysis_figures() -> JSONResponse:
            return JSONResponse(analysis.analysis)

        @app.get("/api/analysis/plots/{name}", summary="one of the analysis's PNG plots", responses=ERRORS)
        def analysis_plot(name: str):
            path = analysis.plot(name)
            if path is None:
                return error_response(404, f"the analysis has no plot named {name!r}", "name")
            return FileResponse(path, media_type="image/png")

    return app
