"""A process-wide count of changes to modules' structure, so that a decoder layer can keep its step's arguments bound
(its tensors and projections, looked up once: each nn.Module attribute lookup costs about a microsecond, and a
layer has dozens) and bind them again only after something changed.

torch's global registration hooks bump it whenever any module, parameter or buffer is registered or assigned (a
projection swapped for another, `load_state_dict` replacing a buffer), and keel's modules that hold tensors a layer
binds bump it in `_apply` (`.to()`, `.float()`, ...), which replaces buffers without registering them. In-place
changes (`copy_` of new weights, what `load_weights` does) keep the tensors bound and need nothing.
"""

from __future__ import annotations

from torch.nn.modules import module as _module

_count = 0


def current() -> int:
    """The count now: bound arguments made at another count are stale."""
    return _count


def bump(*_: object) -> None:
    """Something changed (the hooks' signature: module, name, value; returns None, so the value is kept)."""
    global _count
    _count += 1


_module.register_module_module_registration_hook(bump)
_module.register_module_parameter_registration_hook(bump)
_module.register_module_buffer_registration_hook(bump)
