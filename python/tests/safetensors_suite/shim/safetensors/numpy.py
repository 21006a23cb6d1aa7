"""`safetensors.numpy`, answered by eredu.numpy."""
from eredu.numpy import *  # noqa: F401,F403
from eredu.numpy import load, load_file, save, save_file  # noqa: F401
