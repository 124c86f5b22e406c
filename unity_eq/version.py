"""The version of unity-eq, in a module of its own so that any stage can name it without importing the package's
façade (``unity_eq/__init__`` re-exports the entry points, which import every stage)."""

__version__ = "0.1.0"
