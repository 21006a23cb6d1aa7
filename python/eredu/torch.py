"""`safetensors.torch`, served by eredu: change the import, keep the code.

    from eredu.torch import load_file, save_file    # was: from safetensors.torch import ...

Files written here are the bytes safetensors writes for the same tensors and metadata (up to the
order of the metadata's keys, which safetensors does not fix either). Not yet: load_model and
save_model.
"""

from ._loading import load_file as _load_file
from ._writing import layout, load_bytes, serialize, torch_entries, write_file

__all__ = ["load_file", "load", "save_file", "save"]


def load_file(filename, device="cpu", **options):
    """Every tensor of `filename` as torch tensors on `device` (the CPU; see eredu.load_file)."""
    return _load_file(filename, framework="pt", device=device, **options)


def load(data, **options):
    """Every tensor of the safetensors file held in `data` (bytes), as torch tensors."""
    return load_bytes(data, lambda path: _load_file(path, framework="pt", **options))


def save(tensors, metadata=None):
    """The bytes of a safetensors file holding `tensors` ({name: contiguous torch tensor}, none
    sharing memory with another) and `metadata` ({str: str}), as safetensors.torch.save writes them."""
    return serialize(torch_entries(tensors), metadata)


def save_file(tensors, filename, metadata=None):
    """Writes save(tensors, metadata) to `filename`, whole or not at all (a temporary file
    beside it, renamed over it once complete)."""
    write_file(layout(torch_entries(tensors), metadata), filename)
