"""`longdoc serve`: a local web page and HTTP API to ask documents (longdoc.serve.asking) or to
browse a model's predictions beside the gold (longdoc.serve.browser, with the tasks' views in
tasks/NAME/browse.py), on FastAPI and uvicorn (the `serve` extra); the application is
longdoc.serve.app, the page longdoc/serve/static/."""
