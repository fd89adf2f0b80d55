"""LEAD's HTTP service: a FastAPI adapter over the ``lead`` library.

Run it with ``uvicorn service.app:create_app --factory``.
"""
