"""Synthetic extreme-classification data and converters for real formats.

Installed as `dslide.datasets` (setup.cfg maps this folder there), and
importable under that name only: from the repository root `import datasets`
would otherwise import this folder in place of any other package of that
name (Hugging Face's), and its kernels would be cached under the wrong module.
"""

if __name__ != "dslide.datasets":
    raise ImportError(f"this folder is the package dslide.datasets (setup.cfg installs datasets/ under that "
                      f"name), not {__name__!r}: import dslide.datasets instead (from the repository root, "
                      f"`import datasets` finds the folder itself; run elsewhere to import another package "
                      f"named datasets)", name=__name__)
