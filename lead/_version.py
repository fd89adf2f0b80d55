"""LEAD's version, in a module of its own: any module of ``lead`` may import it."""

__version__ = "0.1.0"
