"""--non-persistent-ckpt-type local (Megatron-Core's flags; issue 41, item 3): frequent, cheap saves each rank
writes into its own directory, holding only its own state, for restarts at the same layout.

    <--non-persistent-local-ckpt-dir>/rank_00003/iter_0000012.pt     rank 3's state at iteration 12
    <--non-persistent-local-ckpt-dir>/rank_00003/iter_0000012.json   its size, CRC-32 and layout position

What a rank saves is what it holds, not the layout-free pieces of a persistent checkpoint: its parameters'
local values (none under ZeRO-3: its optimizer pieces are its parameters' shards), every optimizer piece
(main values and state, the flat ranges of state_pieces()), the optimizer's scalars, the model's non-trained
state, the LR schedule, its RNG states, the iteration and consumed samples. So it restores at the same layout
only, and needs no other rank's file (node-local disks): the .json, written after the .pt is durable and
renamed into place, is what makes a save complete. The last two are kept.

On start-up (collective over the world group, one all-gather): each rank lists its intact local
checkpoints (size, CRC-32, layout position); the newest iteration intact on every rank is loaded when it is
at least the persistent checkpoint's iteration (Megatron-LM's rule), else the persistent one is, and a newer
local checkpoint skipped is said in one line naming the rank and why. A damaged one is never retried.
"""
import contextlib
import json
import os
import zlib

import torch
import torch.distributed as dist

from ...core.debug import fault_point
from ...core.optimizer import StatePiece
from ...core.transformer.model_state import non_trained_state
from ..observability.log import print_rank_0
from .rng_state import layout_position, restore_or_reseed, rng_payload

KEEP = 2


def _name(iteration):
    return f"iter_{iteration:07d}"


class _Rng:
    """What restore_or_reseed reads of a checkpoint: this rank's RNG states."""

    def __init__(self, rng):
        self.rng = rng

    def rng_state(self, name):
        return self.rng


class LocalCheckpoints:
    @classmethod
    def of(cls, train_cfg, *args):
        """The run's local checkpoints (start-up line printed), or None without --non-persistent-ckpt-type local."""
        if train_cfg.non_persistent_ckpt_type != "local":
            return None
        local = cls(train_cfg, *args)
        print_rank_0(local.startup_line())
        return local

    def __init__(self, train_cfg, model, optimizer, groups, device, scheduler):
        self.t, self.model, self.optimizer, self.groups = train_cfg, model, optimizer, groups
        self.device, self.scheduler = device, scheduler
        self.dir = os.path.join(train_cfg.non_persistent_local_ckpt_dir, f"rank_{groups.rank:05d}")
        self.position = json.dumps(layout_position(groups))
        self.with_params = not train_cfg.ddp_config().shards_params

    def startup_line(self):
        return (f"> local checkpoints: every {self.t.non_persistent_save_interval} iterations each rank writes its own "
                f"state to {self.t.non_persistent_local_ckpt_dir}/rank_*/ (last {KEEP} kept, CRC-32; "
                "--non-persistent-ckpt-type local)")

    def after_iteration(self, iteration, consumed):
        """Save when due (with --save, every --non-persistent-save-interval); a failed write is this rank's
        warning line: its last intact local checkpoints stay, and a restart agrees over the ranks' sets."""
        n = self.t.non_persistent_save_interval
        if not (self.t.save and n and iteration % n == 0):
            return
        try:
            self.save(iteration, consumed)
        except OSError as e:
            _remove(os.path.join(self.dir, _name(iteration) + ".pt.tmp"))
            print(f"> warning: rank {self.groups.rank}: local checkpoint of iteration {iteration} not saved in "
                  f"{self.dir}: {e.strerror or e}; training goes on", flush=True)

    def save(self, iteration, consumed):
        """This rank's state (no communication). An OSError is left to the caller."""
        payload = {
            "iteration": iteration, "consumed": consumed,
            "params": [p.detach().cpu().clone() for p in self.model.parameters()] if self.with_params else None,
            "pieces": [{k: v.detach().cpu().clone() for k, v in sp.tensors.items()}
                       for sp in self.optimizer.state_pieces()],
            "scalar": self.optimizer.scalar_state(),
            "buffers": [t.detach().cpu().clone() for _, t in non_trained_state(self.model)],
            "lr_scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "rng": rng_payload(self.groups, self.device),
        }
        os.makedirs(self.dir, exist_ok=True)
        path = os.path.join(self.dir, _name(iteration))
        crc = _durable(path + ".pt.tmp", lambda f: torch.save(payload, f))
        os.replace(path + ".pt.tmp", path + ".pt")
        fault_point("local_ckpt.after", iteration, self.groups.rank, path=path + ".pt")  # `corrupt` drills
        record = {"iteration": iteration, "size": os.path.getsize(path + ".pt"), "crc32": crc,
                  "position": self.position}
        _durable(path + ".json.tmp", lambda f: f.write(json.dumps(record).encode()))
        os.replace(path + ".json.tmp", path + ".json")
        for it in self._iterations()[:-KEEP]:
            for ext in (".json", ".pt"):  # the record first: a half-deleted one is incomplete
                _remove(os.path.join(self.dir, _name(it) + ext))

    def _iterations(self):
        names = os.listdir(self.dir) if os.path.isdir(self.dir) else []
        return sorted(int(n[5:-5]) for n in names if n.startswith("iter_") and n.endswith(".json"))

    def _intact(self):
        """({iteration: path} of this rank's intact local checkpoints, {iteration: why not} of the others)."""
        good, bad = {}, {}
        for it in self._iterations():
            path = os.path.join(self.dir, _name(it))
            try:
                with open(path + ".json") as f:
                    record = json.load(f)
                with open(path + ".pt", "rb") as f:
                    data = f.read()
            except (OSError, ValueError) as e:
                bad[it] = f"{path}.pt cannot be read ({e})"
                continue
            if record.get("position") != self.position:
                bad[it] = f"{path}.pt was saved at another layout"
            elif len(data) != record.get("size") or zlib.crc32(data) != record.get("crc32"):
                bad[it] = f"{path}.pt: size or CRC-32 differs from {_name(it)}.json (damaged)"
            else:
                good[it] = path + ".pt"
        return good, bad

    def choose(self, persistent_iteration, why):
        """Collective. -> the path of this rank's local checkpoint to load, or None (the persistent one).
        why: a list the reason of the choice is appended to (a restarted run's start-up line)."""
        good, bad = self._intact()
        every = [None] * self.groups.world_size
        dist.all_gather_object(every, (sorted(good), bad))
        common = set.intersection(*(set(g) for g, _ in every))
        newest = max(common, default=None)
        load = newest is not None and newest >= persistent_iteration
        skipped = [(it, rank, why) for rank, (_, b) in enumerate(every) for it, why in b.items()
                   if it > (newest if load else persistent_iteration)]
        skipped += [(it, rank, "missing") for rank, (g, b) in enumerate(every)
                    for it in set().union(*(set(x) for x, _ in every)) - set(g) - set(b)
                    if it > (newest if load else persistent_iteration)]
        if skipped:
            it, rank, reason = max(skipped)
            target = f"local checkpoint {_name(newest)}" if load else (
                f"the persistent checkpoint of iteration {persistent_iteration}" if persistent_iteration
                else "no checkpoint (iteration 1)")
            line = (f"> local checkpoint {_name(it)} skipped: not intact on every rank (rank {rank}: {reason}); "
                    f"loading {target}")
            print_rank_0(line)
            why.append(line)
        elif load:
            why.append(f"the newest local checkpoint intact on every rank, at or past the persistent one "
                       f"(iteration {persistent_iteration})")
        return good[newest] if load else None

    @torch.no_grad()
    def load(self, path):
        """Restore this rank's state from its file (collective: the RNG decision). -> (iteration, consumed)."""
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload["params"] is not None:
            for p, value in zip(self.model.parameters(), payload["params"]):
                p.data.copy_(value)
        self.optimizer.load_state_pieces(StatePiece(sp.param, sp.start, sp.end, tensors)
                                         for sp, tensors in zip(self.optimizer.state_pieces(), payload["pieces"]))
        self.optimizer.load_scalar_state(payload["scalar"])
        for (_, t), value in zip(non_trained_state(self.model), payload["buffers"]):
            t.copy_(value)
        if self.scheduler is not None and payload["lr_scheduler"] is not None:
            self.scheduler.load_state_dict(payload["lr_scheduler"])
        if not self.t.no_load_rng:
            restore_or_reseed(_Rng(payload["rng"]), self.groups, self.t, self.device, payload["iteration"])
        print_rank_0(f"> loaded local checkpoint {_name(payload['iteration'])} from "
                     f"{self.t.non_persistent_local_ckpt_dir}/rank_*/ at iteration {payload['iteration']}, "
                     f"{payload['consumed']} consumed samples (--non-persistent-ckpt-type local)")
        return payload["iteration"], payload["consumed"]


def _durable(path, write):
    """write(file) through a CRC-32, fsync; -> the CRC-32."""
    crc = 0

    class _Crc:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            nonlocal crc
            crc = zlib.crc32(data, crc)
            return self.f.write(data)

        def flush(self):
            self.f.flush()

    with open(path, "wb") as f:
        write(_Crc(f))
        f.flush()
        os.fsync(f.fileno())
    return crc


def _remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
