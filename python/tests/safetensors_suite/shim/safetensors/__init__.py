"""`import safetensors`, answered by eredu: what safetensors' own tests import, re-exported
from eredu's drop-in (run_suite.py puts this directory first on sys.path)."""
from eredu import SafetensorError, TensorSpec, __version__, deserialize, safe_open, serialize, serialize_file  # noqa: F401
from eredu import _safe_open_handle  # noqa: F401
