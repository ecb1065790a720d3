"""The OpenAI-compatible server (``dspark.server.serve.create_app``, ``dspark serve``).

Nothing is imported here, so that ``dspark``'s command line works on machines without the
server's dependencies (FastAPI, uvicorn).
"""
