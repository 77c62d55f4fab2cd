"""The test server (`running`, uvicorn in a thread) leaves the process's logging as it found it."""

import logging

from tests.serve.conftest import request, running


async def _hello(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


def test_serving_closes_no_logging_handler_of_the_process():
    # A handler closed behind its owner's back is how the suite once broke: absl's handler, closed by
    # uvicorn's logging set-up, closed the stream it held, pytest's capture, and every later test errored.
    closed = []

    class Recording(logging.Handler):
        def emit(self, record):
            pass

        def close(self):
            closed.append(self)
            super().close()

    handler = Recording()
    logging.getLogger().addHandler(handler)
    try:
        with running(_hello) as base:
            assert request(base + "/") == (200, "hello")
    finally:
        logging.getLogger().removeHandler(handler)
    assert closed == []
