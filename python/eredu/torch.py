"""`safetensors.torch`'s loading function, served by eredu: change the import, keep the code.

    from eredu.torch import load_file    # was: from safetensors.torch import load_file
"""

from ._loading import load_file as _load_file


def load_file(filename, device="cpu", **options):
    """Every tensor of `filename` as torch tensors on `device` (the CPU; see eredu.load_file)."""
    return _load_file(filename, framework="pt", device=device, **options)
