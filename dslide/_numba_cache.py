"""numba's on-disk cache, keyed by the module name of dslide's kernels too.

numba keys a cached kernel by its source file (the file's path and a hash of
its content), not by the name of the module it was compiled in; the compiled
code, though, refers to that module by name. A package folder imported under
another name (dslide/lsh/ put on sys.path as `lsh`) would have its kernels
cached as module `lsh`, and a later run, finding the entry for the same file,
would load it and die on every rank with `ModuleNotFoundError: No module
named 'lsh'`. This module makes the cache refuse such entries: for every
kernel of a module named dslide.*, the
source stamp numba keeps in the cache index is (numba's stamp, the module's
name), so an index written under any other name (or by a dslide from before
this change) does not match and is recompiled, never loaded.

Imported, for its effect, by the modules that define cached kernels
(dslide.rng, dslide.model.bfloat16, dslide.io.data, dslide.infer.fusion, dslide.lsh's _common;
dslide.model.kernels and dslide.datasets through dslide.rng and dslide.io.data), before their decorators
run: it prepends locator classes to numba's list that take dslide's kernels
and leave every other function to numba's own classes (so other packages'
caches in the same process are untouched).
"""

from __future__ import annotations

from numba.core import caching


def _ours(py_func) -> bool:
    module = getattr(py_func, "__module__", None) or ""
    return module == "dslide" or module.startswith("dslide.")


def _module_keyed(base):
    class Locator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if not _ours(py_func):
                return None  # numba's own classes, further down the list, take it
            self = super().from_function(py_func, py_file)
            if self is not None:
                self._dslide_module = py_func.__module__
            return self

        def get_source_stamp(self):
            return (super().get_source_stamp(), self._dslide_module)

    Locator.__name__ = Locator.__qualname__ = f"ModuleKeyed{base.__name__}"
    return Locator


def install() -> None:
    """Prepend the module-keyed locators to numba's list (once)."""
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # the name before numba 0.61
    classes = impl._locator_classes
    if any(getattr(c, "__name__", "").startswith("ModuleKeyed") for c in classes):
        return
    # (IPython cells are no module of dslide)
    classes[:0] = [_module_keyed(c) for c in classes if "IPython" not in c.__name__]


install()
