"""gemmgen: a GEMM kernel generator for PyTorch (import package ``generator``).

The Jinja templates and the plain CUDA headers they include live in the top-level ``templates/``
folder; they ship in the wheel as the data-only package ``gemmgen_templates``, where
``generator.render.templates_dir()`` finds them when there is no source checkout beside it.
"""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"

# Every template and header, at the top of templates/ and in its subfolders (common/, ptx/, sm80/, and
# the families to come). Patterns are relative to templates/.
TEMPLATE_PATTERNS = [
    f"{folder}{ext}"
    for folder in ("", "*/", "*/*/", "common/", "ptx/", "sm80/")
    for ext in ("*.j2", "*.h", "*.cuh", "*.cu", "*.cpp")
]

setup(
    name="gemmgen",
    version="0.1.0",
    description="A GEMM kernel generator for PyTorch: plan, render (Jinja), build (ninja, cached), call as a torch op",
    long_description=README.read_text(encoding="utf-8") if README.exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    package_dir={"generator": "generator", "gemmgen_templates": "templates"},
    packages=find_packages(include=["generator", "generator.*"]) + ["gemmgen_templates"],
    # generator/tune/tables: the dispatch tables measured per GPU model (generator/tune/shipped.py)
    package_data={"gemmgen_templates": TEMPLATE_PATTERNS, "generator.tune": ["tables/*.json"]},
    include_package_data=True,
    install_requires=["jinja2", "pybind11", "torch", "ninja", "tqdm"],   # tqdm: tuning's progress bars
    # plot: python -m generator plot (matplotlib); the tests draw one too, so test carries it
    extras_require={"test": ["pytest", "matplotlib"], "plot": ["matplotlib"]},
    entry_points={"console_scripts": ["gemmgen = generator.cli:main"]},
    zip_safe=False,
)
