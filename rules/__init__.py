"""Installed as ``unity_eq.rules`` (pyproject ``[tool.setuptools.package-dir]``): the shipped ``.egg`` rule files.

Data, not code: unity_eq.rulefile.manifest lists which files load (the manifest) and proofs.json certifies them.
"""
