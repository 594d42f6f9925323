"""Output paths checked before any work: a run must not find at its first save (or its very end)
that it cannot write there.

Nothing permanent is written: the nearest existing folder of the path gets a probe file that is
removed at once (the permission bits alone say nothing to root, and nothing about a read-only
mount). Missing folders are not made here; the writer makes them as it always did.
"""
import os
import tempfile

from ...core.errors import ConfigError


def check_writable(path, flag, kind="dir"):
    """ConfigError (naming flag and path) unless `path` can be written: a folder (kind "dir") that
    exists or can be made, or a file (kind "file") whose folder can."""
    path = os.path.abspath(path)
    if kind == "dir" and os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a file, not a folder; give a folder")
    if kind == "file" and os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a folder; give a file name")
    folder = path if kind == "dir" else os.path.dirname(path)
    existing = folder
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"{flag} {path}: {existing} is a file, so no folder can be made under it; "
                          "give another path")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".write-test-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write in {existing} ({e.strerror or e}); "
                          "give a writable path") from None


def check_outputs(train_cfg):
    """--save, --tensorboard-dir, --pipeline-trace, --wandb-save-dir and the torch.profiler trace folder
    are writable (each where given)."""
    profile = train_cfg.profile and train_cfg.use_pytorch_profiler and train_cfg.tensorboard_dir
    for flag, path, kind in (("--save", train_cfg.save, "dir"), ("--tensorboard-dir", train_cfg.tensorboard_dir, "dir"),
                             ("--pipeline-trace", train_cfg.pipeline_trace, "file"),
                             ("--wandb-save-dir", train_cfg.wandb_project and train_cfg.wandb_save_dir, "dir"),
                             ("--use-pytorch-profiler (its trace folder)",
                              profile and profile_dir(train_cfg.tensorboard_dir), "dir")):
        if path:
            check_writable(path, flag, kind)


def profile_dir(tensorboard_dir):
    """Where --use-pytorch-profiler writes its traces: torch_profile beside the TensorBoard folder
    (Megatron-LM's TENSORBOARD_DIR/../torch_profile)."""
    return os.path.join(os.path.dirname(os.path.abspath(tensorboard_dir)), "torch_profile")
