"""safetensors.torch, served by eredu.torch (with the private helpers safetensors' tests import)."""

from eredu.torch import *  # noqa: F401,F403
from eredu.torch import (_end_ptr, _find_shared_tensors, _is_complete, _remove_duplicate_names,  # noqa: F401
                         storage_ptr, storage_size)
