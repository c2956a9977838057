"""Forked kernel libraries that keel vendors, each its own stable-ABI native library.

`keel.vendored.<dep>` (for example `keel.vendored.deep_gemm`) loads
`keel/vendored/<dep>/_C.abi3.so` (and its CUDA twin on a CUDA build of torch) when it is
first imported, never as a side effect of `import keel`: a library that cannot load costs
only its own module, whose import error names the library and the cause.
"""

from __future__ import annotations

from keel.vendored._loader import VendoredLibrary, VendoredLibraryError, load_vendored

__all__ = ["VendoredLibrary", "VendoredLibraryError", "load_vendored"]
