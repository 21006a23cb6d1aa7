"""`safetensors.torch`, served by eredu: change the import, keep the code.

    from eredu.torch import load_file, save_file    # was: from safetensors.torch import ...

Files written here are the bytes safetensors writes for the same tensors and metadata (up to the
order of the metadata's keys, which safetensors does not fix either). load_model reads a
checkpoint straight into a model's parameters, or makes eredu's tensors the parameters of a model
built on the meta device: no second copy of the model (eredu._model_load).
"""

from . import _model_load
from ._loading import load_file as _load_file
from ._model_load import (_end_ptr, _filter_shared_not_shared, _find_shared_tensors, _is_complete,  # noqa: F401
                          _remove_duplicate_names, storage_ptr, storage_size)
from ._writing import layout, load_bytes, serialize, torch_entries, write_file

__all__ = ["load_file", "load", "save_file", "save", "load_model", "save_model", "storage_ptr", "storage_size"]


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


def save_model(model, filename, metadata=None, force_contiguous=True):
    """safetensors.torch.save_model: model.state_dict() without the names sharing memory with a
    kept one (recorded in the metadata as dropped -> kept), made contiguous where
    `force_contiguous`; a ValueError names force_contiguous=True when a tensor is not."""
    _model_load.save_model(model, filename, metadata, force_contiguous, save_file=save_file)


def load_model(model, filename, strict=True, device="cpu", **options):
    """safetensors.torch.load_model: loads `filename` into `model` with no second copy (read into
    its parameters, or assigned as them when they are on the meta device); returns (missing,
    unexpected) and, with `strict`, raises RuntimeError when either is non-empty. `options` are
    eredu's (budget, threads, backend=, ...)."""
    return _model_load.load_model(model, filename, strict, device, **options)
