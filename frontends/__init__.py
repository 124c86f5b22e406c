"""Installed as ``unity_eq.frontends`` (pyproject ``[tool.setuptools.package-dir]``): import it by that name.

Model readers: an ONNX file (or an in-memory ModelProto) into a unity_eq Graph (:mod:`unity_eq.frontends.onnx`).
"""
