"""eredu.torch's load_model and save_model: safetensors.torch's, with the load made without a
second copy of the model.

    model = build_model()                               # parameters on the CPU...
    missing, unexpected = eredu.torch.load_model(model, "model.safetensors")
    with torch.device("meta"): model = build_model()    # ...or on the meta device (torch >= 2.0)
    eredu.torch.load_model(model, "model.safetensors")  # eredu's tensors become the parameters

Tied and shared weights are handled as safetensors handles them: save_model keeps one name of
each group of tensors sharing memory (the metadata maps each dropped name to the kept one), and
load_model reads that one name into the shared memory, so tied weights stay tied.

Where each tensor goes (decided per tensor, before anything is read):

  into      the model's tensor exists on the CPU, contiguous, with the file's dtype and shape:
            the file's bytes are read straight into its memory (eredu._native.read_into), with
            no tensor of eredu's in between. Peak memory: the model itself.
  assign    the model's tensor is on the meta device (built without memory): eredu loads the
            tensor and it becomes the parameter (buffer) itself — a new Parameter object with
            the old one's requires_grad, the same new object wherever the old one was tied
            (cast to the meta tensor's dtype a group at a time, as for copy, where they differ).
  copy      anything else (another dtype, a non-contiguous tensor): eredu loads the tensor and
            torch copies it in (casting), in groups of at most the staging budget's bytes, so
            the transient second copy stays bounded.

The private helpers safetensors' own tests import (storage_ptr, storage_size, _end_ptr,
_is_complete, _find_shared_tensors, _remove_duplicate_names) have safetensors' names and
behaviour; eredu.torch re-exports them.
"""

from collections import defaultdict

from . import _bridge, _native
from ._frameworks import torch_module
from ._options import device as check_device
from ._safe_open import _Reader
from ._writing import _TORCH_DTYPE as _DTYPE_NAMES  # torch dtype name -> safetensors'


# --- safetensors.torch's private helpers (same names, same results) ---

def storage_ptr(tensor):
    """Address of the storage `tensor` views (0 for the meta device, which has none)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except AttributeError:  # torch < 2.0
        try:
            return tensor.storage().data_ptr()
        except NotImplementedError:
            return 0
    except NotImplementedError:
        return 0


def storage_size(tensor):
    """Bytes of the storage `tensor` views (for the meta device, the tensor's own bytes)."""
    try:
        return tensor.untyped_storage().nbytes()
    except AttributeError:  # torch < 2.0
        try:
            return tensor.storage().size() * tensor.element_size()
        except NotImplementedError:
            return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor):
    """One past the address of `tensor`'s last element (its start when it has none)."""
    if tensor.nelement():
        return tensor.view(-1)[-1].data_ptr() + tensor.element_size()
    return tensor.data_ptr()


def _filter_shared_not_shared(groups, state_dict):
    """Splits each group of names sharing a storage into groups whose byte ranges overlap."""
    out = []
    for names in groups:
        if len(names) < 2:
            out.append(names)
            continue
        areas = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in names)
        _, reach, first = areas[0]
        out.append({first})
        for start, stop, name in areas[1:]:
            if start >= reach:
                out.append({name})
            else:
                out[-1].add(name)
            reach = stop  # as safetensors: the last area's end, not the furthest
    return out


def _find_shared_tensors(state_dict):
    """Groups of names whose tensors share memory (a group of one for a tensor sharing none),
    sorted; tensors without storage (the meta device, empty storages) are left out."""
    torch = torch_module()
    by_storage = defaultdict(set)
    meta = torch.device("meta")
    for name, t in state_dict.items():
        if t.device != meta and storage_ptr(t) != 0 and storage_size(t) != 0:
            by_storage[(t.device, storage_ptr(t), storage_size(t))].add(name)
    return _filter_shared_not_shared(sorted(by_storage.values()), state_dict)


def _is_complete(tensor):
    """True when `tensor` covers its whole storage, from its first byte, with no holes."""
    return tensor.data_ptr() == storage_ptr(tensor) and tensor.nelement() * tensor.element_size() == storage_size(
        tensor)


def _incomplete_error(names):
    return RuntimeError(
        "Error while trying to find names to remove to save state dict, but found no suitable name to keep for "
        f"saving amongst: {names}. None is covering the entire storage.Refusing to save/load the model since you "
        "could be storing much more memory than needed. Please refer to "
        "https://huggingface.co/docs/safetensors/torch_shared_tensors for more information. Or open an issue.")


def _remove_duplicate_names(state_dict, *, preferred_names=None, discard_names=None):
    """{kept name: [names dropped for it]} for each group of names sharing memory: the kept name
    covers the whole storage, and is the first (sorted) of `preferred_names`, else of those not in
    `discard_names`, else of all. RuntimeError when no name of a group covers its storage."""
    preferred = set(preferred_names or ())
    discard = set(discard_names or ())
    to_remove = defaultdict(list)
    for shared in _find_shared_tensors(state_dict):
        complete = {n for n in shared if _is_complete(state_dict[n])}
        if not complete:
            raise _incomplete_error(shared)
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        for name in sorted(shared):
            if name != keep:
                to_remove[keep].append(name)
    return to_remove


# --- save_model ---

def save_model(model, filename, metadata=None, force_contiguous=True, *, save_file):
    """safetensors.torch.save_model: saves model.state_dict() without the names that share memory
    with a kept one (each recorded in the metadata as dropped -> kept, unless the caller's metadata
    has that key), contiguous copies of non-contiguous tensors where `force_contiguous`."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        # safetensors' words and type: a plain ValueError that names the way out.
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True), read the docs for potential "
                         "caveats.") from e


# --- load_model ---

def _tied_groups(tensors, in_file):
    """{kept name: [other names]} for meta-device tensors that are one object under several names
    (tied weights of a model built on the meta device, which _find_shared_tensors cannot see: they
    have no storage). The kept name is the first (sorted) of those in the file, else of all."""
    by_object = defaultdict(list)
    torch = torch_module()
    for name, t in tensors.items():
        if t.device == torch.device("meta"):
            by_object[id(t)].append(name)
    groups = {}
    for names in by_object.values():
        if len(names) > 1:
            names.sort()
            keep = next((n for n in names if n in in_file), names[0])
            groups[keep] = [n for n in names if n != keep]
    return groups


def _load_error(model, missing, unexpected, mismatched=()):
    error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
    if missing:
        error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
    if unexpected:
        error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
    for line in mismatched:
        error += "\n    " + line
    return RuntimeError(error)


def _route(tensor, info, torch):
    """"into", "assign" or "copy" (see the module comment) for the model's `tensor` and the file's `info`."""
    if tensor.device == torch.device("meta"):
        return "assign"
    if (tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.layout == torch.strided
            and _DTYPE_NAMES.get(str(tensor.dtype).removeprefix("torch.")) == info.dtype
            and tensor.nelement() * tensor.element_size() == info.nbytes and info.nbytes > 0):
        return "into"
    return "copy"


def load_model(model, filename, strict=True, device="cpu", **options):
    """safetensors.torch.load_model: loads `filename` into `model` (see the module comment for
    where each tensor goes) and returns (missing, unexpected) as safetensors does: `missing` the
    model's names the file did not provide (a set), `unexpected` the file's names the model did not
    take (a list), each counting tied names as safetensors does. With `strict`, either being
    non-empty raises RuntimeError with torch's message, before anything is read. A shape that
    differs from the model's raises RuntimeError ("size mismatch for ...") whatever `strict`."""
    torch = torch_module()
    if check_device(device, "pt") != "cpu":
        from ._errors import python_error
        raise python_error("invalid_argument", f"load_model(device={device!r}): eredu loads into a model's CPU "
                           "parameters; load it, then model.to(device)", file=filename if isinstance(filename, str)
                           else None)
    reader = _Reader.open(filename, "pt", copier="load_model", **options)
    try:
        return _load_into(model, reader, strict, torch)
    finally:
        reader.native.close()


def _load_into(model, reader, strict, torch):
    tensors = model.state_dict(keep_vars=True)
    in_file = reader.infos
    drops = _remove_duplicate_names({k: v.detach() for k, v in tensors.items()}, preferred_names=in_file.keys())
    for keep, others in _tied_groups(tensors, in_file).items():
        drops.setdefault(keep, []).extend(others)

    # What load_state_dict(strict=False) would report, then safetensors' correction for tied names.
    missing = {n for n in tensors if n not in in_file}
    unexpected = [n for n in reader.order if n not in tensors]
    dropped = set()
    for others in drops.values():
        for name in others:
            dropped.add(name)
            if name in missing:
                missing.discard(name)
            else:
                unexpected.append(name)
    wanted = [n for n in reader.order if n in tensors and n not in dropped]
    mismatched = [f"size mismatch for {n}: copying a param with shape {torch.Size(in_file[n].shape)} from "
                  f"checkpoint, the shape in current model is {tensors[n].shape}."
                  for n in wanted if tuple(tensors[n].shape) != tuple(in_file[n].shape)]
    if mismatched or (strict and (missing or unexpected)):
        raise _load_error(model, missing if strict else (), unexpected if strict else (), mismatched)

    routes = defaultdict(list)
    for name in wanted:
        routes[_route(tensors[name], in_file[name], torch)].append(name)

    # Meta tensors first, all or nothing: nothing is assigned until every one of them is loaded.
    # Those of the model's dtype in one unit; the others a budget's worth at a time, each cast
    # before the next group is read, so the stored dtype's copy never exists whole.
    same = [n for n in routes["assign"] if _DTYPE_NAMES.get(str(tensors[n].dtype).removeprefix("torch.")) ==
            in_file[n].dtype]
    loaded = reader.read(same) if same else {}
    for group in _groups(reader, [n for n in routes["assign"] if n not in loaded]):
        loaded.update({n: t.to(tensors[n].dtype) for n, t in reader.read(group).items()})
    try:
        if routes["into"]:
            destinations = [(n, tensors[n].data_ptr(), in_file[n].nbytes) for n in routes["into"]]
            _bridge.wait(_native.read_into(reader.native, destinations))
        _copy_in(reader, routes["copy"], tensors, torch)
    except BaseException as e:
        # Without a second copy there is nothing to roll back to: the caller must know that
        # the model is neither the old weights nor the new ones.
        if routes["into"] or routes["copy"]:
            e.add_note(f"load_model stopped partway: some of the model's parameters already hold the bytes "
                       f"of {reader.native.path}, the others their old values; load the model again")
        raise
    if loaded:
        _assign(model, {id(tensors[n]): (tensors[n], t) for n, t in loaded.items()}, torch)
    return missing, unexpected


def _groups(reader, names):
    """`names` in groups of at most the staging budget's bytes (one tensor at least), in order."""
    budget = max(1, reader.native.staging()["budget"])
    group, size = [], 0
    for name in names:
        group.append(name)
        size += reader.infos[name].nbytes
        if size >= budget:
            yield group
            group, size = [], 0
    if group:
        yield group


def _copy_in(reader, names, tensors, torch):
    """Loads `names` a group at a time (_groups) and copies each into the model's tensor,
    casting as torch's copy_ does."""
    for group in _groups(reader, names):
        with torch.no_grad():
            for n, t in reader.read(group).items():
                tensors[n].copy_(t)


def _assign(model, replacements, torch):
    """Makes each loaded tensor the module's parameter or buffer in place of the meta tensor
    `replacements` maps (by id) to it, wherever that meta tensor is registered: tied stay tied."""
    made = {}

    def replacement(old):
        key = id(old)
        if key not in made:
            template, new = replacements[key]
            if new.dtype != template.dtype:
                new = new.to(template.dtype)
            if isinstance(template, torch.nn.Parameter):
                new = torch.nn.Parameter(new, requires_grad=template.requires_grad)
            made[key] = new
        return made[key]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, old in list(table.items()):
                if old is not None and id(old) in replacements:
                    table[name] = replacement(old)
