"""`safetensors.numpy`'s loading functions, served by eredu: change the import, keep the code.

    from eredu.numpy import load_file    # was: from safetensors.numpy import load_file
"""

from ._loading import load_file as _load_file


def load_file(filename, **options):
    """Every tensor of `filename` as numpy arrays (BF16 as uint16 bits; see eredu.load_file)."""
    return _load_file(filename, framework="np", **options)
