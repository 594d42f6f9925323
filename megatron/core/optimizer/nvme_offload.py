"""--optimizer-offload-path DIR (ours; ZeRO-Infinity's idea): the fp32 main values and Adam moments of this
rank's offloaded pieces live in a file under DIR, and the step streams them through a bounded host buffer.

Which pieces: those --optimizer-cpu-offload would keep on the host (all of them without it; its
--optimizer-offload-fraction otherwise, cpu_offload.offloaded); they then have no in-memory copy at all.
The file, DIR/optimizer_state_rank<R>.bin, holds per piece [main | exp_avg | exp_avg_sq] in fp32, pieces
in buffer order. It is preallocated at start-up (os.posix_fallocate), so a disk without room fails there,
before the first iteration, and never half-way through a step.
The step, per chunk of at most `chunk` elements of one piece: read the three slices into the buffer
(pread), copy the gradient slice in (unscaled and clipped on the device already: MegatronOptimizer.step),
run torch's fused AdamW kernel on it (the kernel the in-memory host offload runs; it is elementwise, so
chunking changes no value), write the slices back (pwrite) and the new values into the parameter (or its
ZeRO shard). Plain reads and writes, not mmap: the page cache stays out of this process's resident memory,
and the buffer (four fp32 chunks, pinned on CUDA) is all the host memory the state takes during a step.
Checkpoints see the state through the rule's state() (read whole, transiently) and write it back piece by
piece (write()): they hold it layout-free as always, so a run resumes with or without the path.
"""
import os
from dataclasses import dataclass

import torch

from ..errors import MegatronUserError
from ..tensor_parallel.param_meta import has_weight_decay, is_embedding_or_output
from .adam import ADAM_STATES
from .update_rule import UpdateRule

NAMES = ("param",) + ADAM_STATES  # the order of a piece's three regions in the file


class OffloadFileError(MegatronUserError):
    """The state file cannot be created, filled or read (unwritable folder, disk full): one line for the user."""


@dataclass(frozen=True)
class FileOffload:
    """Where and how: the folder, this rank's number (its file's name), the host buffer's bytes."""
    path: str
    rank: int
    buffer_bytes: int

    @property
    def file(self) -> str:
        return os.path.join(self.path, f"optimizer_state_rank{self.rank:05d}.bin")


class FileAdamRule(UpdateRule):
    """AdamW over pieces whose state lives in `where`'s file. high_water: the buffer's bytes (all it holds)."""

    name = "adam"
    state_names = ADAM_STATES

    def __init__(self, pieces, where: FileOffload, lr, weight_decay, betas, eps, device):
        super().__init__(pieces)
        self.betas, self.eps = betas, eps
        self.chunk = max(1, where.buffer_bytes // 16)  # main, exp_avg, exp_avg_sq and the gradient, fp32
        self._buf = torch.zeros(4, self.chunk, dtype=torch.float32, pin_memory=device.type == "cuda")
        self.high_water = self._buf.numel() * 4
        self._step = torch.zeros((), dtype=torch.float32)
        self._groups, self._group_of, self._base = [], {}, {}
        for pc in self.pieces:
            key = (is_embedding_or_output(pc.param), has_weight_decay(pc.param))
            if key not in self._group_of:
                self._group_of[key] = {"params": [], "lr": lr, "weight_decay": weight_decay if key[1] else 0.0,
                                       "embedding_or_output": key[0]}
                self._groups.append(self._group_of[key])
            self._group_of[key]["params"].append(pc.param_view)
        offset = 0
        for pc in self.pieces:
            self._base[id(pc)] = offset
            offset += 3 * 4 * pc.param_view.numel()
        self.file_bytes = offset
        try:
            os.makedirs(where.path, exist_ok=True)
            self._fd = os.open(where.file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            if offset:
                os.posix_fallocate(self._fd, 0, offset)
            for pc in self.pieces:  # the main values from the parameters, the moments zero
                self.write(pc, "param", pc.param_view.detach())
                for name in ADAM_STATES:
                    self.write(pc, name, torch.zeros(pc.param_view.numel()))
        except OSError as e:
            raise OffloadFileError(f"--optimizer-offload-path {where.path}: cannot hold this rank's {offset:,} bytes "
                                   f"of optimizer state in {where.file} ({e.strerror or e}); free space there or "
                                   "give another folder") from None

    @property
    def param_groups(self):
        return self._groups

    def _io(self, pc, name, lo, out=None, data=None):
        """Read elements [lo, lo + len(out)) of a piece's region `name` into out, or write data there."""
        at = self._base[id(pc)] + 4 * (NAMES.index(name) * pc.param_view.numel() + lo)
        if out is not None:
            view = memoryview(out.numpy()).cast("B")
            if os.preadv(self._fd, [view], at) != len(view):
                raise OffloadFileError(f"short read of the optimizer state file at byte {at}")
        else:
            blob = memoryview(data.numpy()).cast("B")
            if os.pwrite(self._fd, blob, at) != len(blob):
                raise OffloadFileError(f"short write to the optimizer state file at byte {at}")

    def write(self, pc, name, value) -> None:
        """Store a whole region (value: the piece's elements), chunk by chunk through the buffer's first row."""
        flat, row = value.detach().reshape(-1), self._buf[0]
        for lo in range(0, flat.numel(), self.chunk):
            n = min(self.chunk, flat.numel() - lo)
            row[:n].copy_(flat[lo:lo + n])
            self._io(pc, name, lo, data=row[:n])

    def state(self, piece):
        """{"param", "exp_avg", "exp_avg_sq"}: fresh host tensors read from the file (not live)."""
        out = {}
        for name in NAMES:
            out[name] = torch.empty(piece.param_view.numel(), dtype=torch.float32)
            self._io(piece, name, 0, out=out[name])
        return out

    def memory_bytes(self, on_host=False) -> int:
        return 0  # in the file (file_bytes); the buffer is the run's, not the pieces'

    def step(self, divisor):
        torch._foreach_add_([self._step], 1)
        beta1, beta2 = self.betas
        main, m, v, g = self._buf
        for pc in self.pieces:
            group = self._group_of[(is_embedding_or_output(pc.param), has_weight_decay(pc.param))]
            total = pc.param_view.numel()
            for lo in range(0, total, self.chunk):
                n = min(self.chunk, total - lo)
                parts = [main[:n], m[:n], v[:n]]
                for name, part in zip(NAMES, parts):
                    self._io(pc, name, lo, out=part)
                g[:n].copy_(pc.grad_view[lo:lo + n])
                torch._fused_adamw_([parts[0]], [g[:n]], [parts[1]], [parts[2]], [], [self._step], amsgrad=False,
                                    lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                                    eps=self.eps, maximize=False)
                for name, part in zip(NAMES, parts):
                    self._io(pc, name, lo, data=part)
                pc.param_view[lo:lo + n].copy_(parts[0])

    def scalar_state(self):
        return {"step": float(self._step)} if self.pieces else {}

    def load_scalar_state(self, state):
        self._step.fill_(state.get("step", 0.0))
