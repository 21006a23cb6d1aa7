"""safetensors.numpy, served by eredu.numpy."""

from eredu.numpy import *  # noqa: F401,F403
