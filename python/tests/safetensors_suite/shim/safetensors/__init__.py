"""A `safetensors` package that is eredu: Hugging Face safetensors' own tests import this and so
run against eredu's drop-ins (python/tests/safetensors_suite/run.sh puts it on sys.path)."""

from eredu import Error as SafetensorError  # noqa: F401
from eredu import safe_open  # noqa: F401
