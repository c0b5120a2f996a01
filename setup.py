"""Packages: specviz and its subpackages, found, plus the assets folder as specviz.data (pyproject maps it)."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["specviz", "specviz.*"]), "specviz.data"])
