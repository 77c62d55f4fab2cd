"""Model folders whose weights name the attention's per-softmax parameters the old way
(`attention.long_relative_key`, ...; longdoc.model.attention.OLD_PARAMETER_NAMES) rewritten under the
names the model has now (`attention.long_softmax.relative_key`), once, by `longdoc upgrade DIR`.
Loading such a folder is refused with that command; nothing renames weights as they load."""

from pathlib import Path

from longdoc.errors import InputError


def upgrade_weights(weights_file: Path) -> int:
    """Rename the old parameter names in the safetensors file `weights_file` in place (the file
    replaced whole, its metadata kept); the number of tensors renamed."""
    from safetensors import safe_open
    from safetensors.torch import save

    from longdoc.io import atomic_write_bytes
    from longdoc.model.attention import OLD_PARAMETER_NAMES
    from longdoc.model.encoder_folder import check_weights, checksum_path, record_checksum

    check_weights(weights_file)  # damaged bytes are refused, never renamed and recorded as sound
    renamed = 0
    tensors = {}
    with safe_open(str(weights_file), "pt") as weights:
        metadata = weights.metadata()
        for key in weights.keys():
            prefix, _, name = key.rpartition(".")
            if name in OLD_PARAMETER_NAMES:
                renamed += 1
                tensors[f"{prefix}.{OLD_PARAMETER_NAMES[name]}"] = weights.get_tensor(key)
            else:
                tensors[key] = weights.get_tensor(key)
    if renamed:
        atomic_write_bytes(weights_file, save(tensors, metadata))
        if checksum_path(weights_file).is_file():  # the recorded sha256 must follow the new bytes
            record_checksum(weights_file)
    return renamed


def upgrade_model_folder(folder: str | Path) -> dict[Path, int]:
    """Every safetensors file of `folder` and its subfolders (a run's checkpoints) under the current
    parameter names; {file: tensors renamed} for the files that had old names."""
    folder = Path(folder)
    if not folder.is_dir():
        found = "not a folder" if folder.exists() else "no such folder"
        raise InputError(f"{folder}: {found}; expected a longdoc model folder")
    files = sorted(folder.rglob("*.safetensors"))
    if not files:
        raise InputError(f"{folder}: no .safetensors file; expected a longdoc model folder")
    counts = {path: upgrade_weights(path) for path in files}
    return {path: count for path, count in counts.items() if count}
