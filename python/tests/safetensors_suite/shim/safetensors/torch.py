"""`safetensors.torch`, answered by eredu.torch (the private helpers safetensors' tests import
included)."""
from eredu.torch import *  # noqa: F401,F403
from eredu import torch as _eredu_torch

def __getattr__(name):
    return getattr(_eredu_torch, name)
