"""Save and load training state (--save/--load/--save-interval/--finetune/--no-load-optim/
--no-load-rng/--exit-signal-handler/--async-save/--ckpt-fully-parallel-save/-load) in the
layout-free format of megatron/core/checkpointing.

What is saved: every parameter as its fp32 master value ("param"), its optimizer state (Adam's
exp_avg and exp_avg_sq, or Muon's and SGD's momentum_buffer: optimizer.state_names), the
optimizer's name, Adam's step count and the loss scaler's state, the RNG states of
every rank with its layout position (rng_state.py), the iteration and consumed samples
(data resumes at the next sample), and the arguments. The LR schedule's position is saved
(fp16-skipped iterations do not advance it).
So is the model's non-trained state, e.g. the MoE expert bias (model_state.py).

Who writes what (no piece is written twice): the optimizer's state pieces (whole parameters,
or DP-sharded flat ranges with the distributed optimizer) are written by their owner; with
the plain optimizer only DP rank 0 writes (each DP rank 1/DP with --ckpt-fully-parallel-save);
of copies held by several TP ranks or pipeline stages, the one param_meta.counted_once picks
(TP rank 0 for TP-replicated tensors; never the last stage's tied copy of word_embeddings.weight,
which shares the first's init_key).
"""
import copy
import dataclasses
import signal
import time

import torch
import torch.distributed as dist

from ...core.checkpointing import (
    AsyncSaver,
    CheckpointError,
    begin_save,
    commit,
    local_shard,
    make_piece,
    open_reader,
    read_metadata,
    save_step,
    write_rank_file,
)
from ...core.optimizer import StatePiece
from ...core.tensor_parallel.param_meta import counted_once, data_parallel_replica, param_meta, tensor_parallel_split
from ..loop.elastic_restart import resume_line
from ..observability.log import print_rank_0
from .load_args import find_source, saved_optimizer
from .local_checkpoints import LocalCheckpoints
from .model_state import load_model_state, missing_model_state, model_state_keys, model_state_pieces
from .rng_state import layout_position, layout_sizes, restore_or_reseed, rng_payload
from .save_failures import SaveFailures


def _written_range(sp, groups, optimizer, fully_parallel):
    """The flat range [lo, hi) of StatePiece `sp` this rank writes, or None: one of the TP /
    pipeline copies (counted_once); of the data-parallel replicas (param_meta.data_parallel_replica),
    each its own slices with the distributed optimizer, else replica 0 all, or
    (--ckpt-fully-parallel-save) each replica 1/R of it."""
    if not counted_once(sp.param, groups):
        return None
    r, replicas, _ = data_parallel_replica(sp.param, groups)
    if optimizer.distributed_optimizer or (r == 0 and not fully_parallel):
        return sp.start, sp.end
    if not fully_parallel:
        return None
    n = sp.end - sp.start
    lo, hi = sp.start + n * r // replicas, sp.start + n * (r + 1) // replicas
    return (lo, hi) if hi > lo else None


def _config_dict(cfg):
    return {k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in dataclasses.asdict(cfg).items()}


def _layout(groups, train_cfg):
    return dict(layout_sizes(layout_position(groups)), distributed_optimizer=train_cfg.ddp_config().shards_optimizer)


def save_checkpoint(root, iteration, consumed, model, optimizer, groups, model_cfg, train_cfg, device, scheduler=None,
                    saver=None):
    """Every rank calls this (collective: barriers on the default group, or on saver.group).

    Writes root/iter_XXXXXXX/rank_RRRRR.pt from each rank, then rank 0 commits atomically.
    With `saver` (AsyncSaver, --async-save) only the copy of the state to host memory happens
    here; the writes and the commit run in its background thread.
    """
    start = time.perf_counter()
    pieces = []
    for sp in optimizer.state_pieces():
        if (bounds := _written_range(sp, groups, optimizer, train_cfg.ckpt_fully_parallel_save)) is not None:
            key, (lo, hi) = param_meta(sp.param).init_key, bounds
            tp_rank, tp = tensor_parallel_split(sp.param, groups)
            pieces += [make_piece(key, name, sp.param, tp_rank, tp, lo, hi, value[lo - sp.start:hi - sp.start])
                       for name, value in sp.tensors.items()]
    pieces += model_state_pieces(model, groups)
    payload = {"pieces": pieces, "rng": rng_payload(groups, device)}
    metadata = copy.deepcopy({  # taken now: training goes on while a background save writes
        "consumed_samples": consumed,
        "lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
        "args": {"model": _config_dict(model_cfg), "training": _config_dict(train_cfg)},
        "layout": _layout(groups, train_cfg),
        "optimizer": optimizer.scalar_state(),
    }) if groups.rank == 0 else None

    def write(group=None):  # a step that fails on one rank fails on all, after it (agreement.py)
        rank0 = groups.rank == 0
        save_step(lambda: rank0 and begin_save(root, iteration), root, iteration, groups.rank, group)
        save_step(lambda: write_rank_file(root, iteration, groups.rank, payload, remove_partial=False), root,
                  iteration, groups.rank, group)
        save_step(lambda: rank0 and commit(root, iteration, metadata, groups.world_size), root, iteration,
                  groups.rank, group)
        print_rank_0(f"> saved checkpoint at iteration {iteration} to {root} ({time.perf_counter() - start:.1f} s)")

    if saver is None:
        write()
        return
    waited = saver.submit(lambda: write(saver.group))
    print_rank_0(f"> checkpoint of iteration {iteration}: training blocked {time.perf_counter() - start:.3f} s "
                 f"(of which {waited:.3f} s waiting for the previous save); writing in the background (--async-save)")


def _check_keys(reader, model, strictness="raise_all"):
    """Model tensors the checkpoint lacks and checkpoint tensors the model lacks (the union over all ranks: a
    pipeline stage holds only its layers), handled as --dist-ckpt-strictness says (Megatron-LM's names:
    its "unexpected" keys are the model's the checkpoint lacks). -> (the non-trained state keys the
    checkpoint lacks (checkpoint_model_state.missing_model_state), the model tensors to leave as initialised)."""
    mine = {param_meta(p).init_key for p in model.parameters()}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (sorted(mine), model_state_keys(model)))
    wanted = {key for keys, _ in every for key in keys}  # every rank decides alike
    absent = sorted(key for key in wanted if not reader.has(key))
    extra = sorted(set(reader.keys()) - wanted)
    if absent and strictness in ("assume_ok_unexpected", "raise_unexpected", "raise_all"):
        raise CheckpointError(f"checkpoint {reader.path} has no tensor {absent[0]!r} "
                              "(was it saved with other model flags?)")
    if extra and strictness == "raise_all":
        raise CheckpointError(f"checkpoint tensor {extra[0]!r} is not in the model "
                              f"({len(extra)} such; was it saved with other model flags?)")
    if absent:  # log_*, return_*, ignore_all: those keep their initial values
        print_rank_0(f"> warning: checkpoint {reader.path} has no tensor {absent[0]!r} ({len(absent)} such): "
                     f"left as initialised (--dist-ckpt-strictness {strictness})")
    if extra and strictness == "log_all":
        print_rank_0(f"> warning: checkpoint tensor {extra[0]!r} is not in the model ({len(extra)} such): not read "
                     "(--dist-ckpt-strictness log_all)")
    return missing_model_state(reader, [state for _, state in every]), set(absent)


def _read_shard(reader, key, state, param, groups, ranges, fully_parallel):
    """This rank's TP shard (param's shape) of key/state; only `ranges` of it when not None.
    With --ckpt-fully-parallel-load a shard all its data-parallel replicas need (the parameters; with
    the plain optimizer its state too) is read 1/R by each of the R replicas and all-gathered over
    them (param_meta.data_parallel_replica: groups.dp_cp, or groups.edp for an expert's)."""
    numel = param.numel()
    r, dp, group = data_parallel_replica(param, groups)
    if not fully_parallel or dp == 1 or ranges not in (None, [(0, numel)]):
        return reader.shard(key, state, param, *tensor_parallel_split(param, groups), ranges)
    bounds = [numel * i // dp for i in range(dp + 1)]
    mine = reader.shard(key, state, param, *tensor_parallel_split(param, groups), [(bounds[r], bounds[r + 1])])
    buf = torch.zeros(-(-numel // dp), dtype=mine.dtype, device=param.device)
    buf[:bounds[r + 1] - bounds[r]] = mine.reshape(-1)[bounds[r]:bounds[r + 1]]
    parts = [torch.empty_like(buf) for _ in range(dp)]
    dist.all_gather(parts, buf, group=group)
    return torch.cat([parts[i][:bounds[i + 1] - bounds[i]] for i in range(dp)]).view(param.shape)


def _loads_optimizer(reader, model, optimizer, train_cfg):
    """Whether the optimizer state is loaded: not with --finetune / --no-load-optim, nor from a checkpoint
    without it; a checkpoint of another optimizer is a CheckpointError (check_load says so up front)."""
    if train_cfg.finetune or train_cfg.no_load_optim:
        return False
    saved = saved_optimizer(reader.metadata)
    if saved is not None and saved != optimizer.name:
        raise CheckpointError(f"checkpoint {reader.path} holds {saved}'s optimizer state, not {optimizer.name}'s: "
                              "give --no-load-optim to load its weights only")
    if saved is None:
        return False
    if optimizer.name == "adam":  # every tensor has Adam's moments (fast with an index)
        return reader.complete("exp_avg")
    return all(reader.has(param_meta(p).init_key, s) for p in model.parameters() for s in optimizer.state_names(p))


@torch.no_grad()
def load_checkpoint(path, model, optimizer, groups, train_cfg, device, scheduler=None):
    """Load a validated checkpoint directory into this rank's shards (any layout).

    Returns (iteration, consumed samples), both 0 with --finetune.
    """
    reader = open_reader(path)  # with an index: only this rank's byte ranges
    meta = reader.metadata
    no_state, absent = _check_keys(reader, model, train_cfg.dist_ckpt_strictness)
    load_optim = _loads_optimizer(reader, model, optimizer, train_cfg)
    ranges_of = {}
    for sp in optimizer.state_pieces():
        ranges_of.setdefault(id(sp.param), []).append((sp.start, sp.end))
    params = [p for p in model.parameters() if param_meta(p).init_key not in absent]
    for p in params:  # shapes are checked (local_shard) before anything changes
        shape = reader.shape(param_meta(p).init_key)
        local_shard(torch.empty(shape, device="meta"), p, *tensor_parallel_split(p, groups))
    for p in params:
        key = param_meta(p).init_key
        value = _read_shard(reader, key, "param", p, groups, None, train_cfg.ckpt_fully_parallel_load)
        p.data.copy_(value)
        states = {"param": value}
        if load_optim:
            for s in optimizer.state_names(p):
                states[s] = _read_shard(reader, key, s, p, groups, ranges_of.get(id(p), []),
                                        train_cfg.ckpt_fully_parallel_load)
        optimizer.load_state_pieces(StatePiece(p, lo, hi, {s: v.reshape(-1)[lo:hi] for s, v in states.items()})
                                    for lo, hi in ranges_of.get(id(p), []))
    if load_optim:
        optimizer.load_scalar_state(meta["optimizer"])
    load_model_state(reader, model, groups, no_state)
    if not (train_cfg.finetune or train_cfg.no_load_rng):
        restore_or_reseed(reader, groups, train_cfg, device, meta["iteration"])
    reader.close()
    iteration, consumed = (0, 0) if train_cfg.finetune else (meta["iteration"], meta["consumed_samples"])
    # the schedule skips fp16-skipped iterations, so its position is saved rather than derived
    if scheduler is not None and not train_cfg.finetune:
        scheduler.load_state_dict(meta.get("lr_scheduler") or {"num_steps": consumed})
    print_rank_0(f"> loaded checkpoint {path} (saved at {meta['layout']}) at iteration {iteration}, "
                 f"{consumed} consumed samples; optimizer state {'loaded' if load_optim else 'NOT loaded'}")
    return iteration, consumed


class Checkpointer:
    """The few calls pretrain() makes: load() once, after_iteration() each iteration,
    finish() at the end. Holds the SIGTERM flag of --exit-signal-handler."""

    def __init__(self, model_cfg, train_cfg, model, optimizer, groups, device, scheduler=None):
        self.model_cfg, self.t, self.model, self.optimizer = model_cfg, train_cfg, model, optimizer
        self.groups, self.device, self.scheduler = groups, device, scheduler
        self.last_saved = None
        self.saver = AsyncSaver() if train_cfg.async_save else None  # collective: every rank makes its group
        self.failures = SaveFailures(train_cfg.max_consecutive_save_failures)
        self.local = LocalCheckpoints.of(train_cfg, model, optimizer, groups, device, scheduler)  # or None
        if train_cfg.save:
            print_rank_0(self.failures.startup_line())
        self._signalled = False
        if train_cfg.exit_signal_handler:
            signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame):
        self._signalled = True  # acted on after the current iteration, on every rank at once

    def load(self):
        """(iteration, consumed samples) to start from: (0, 0) without --load or checkpoint."""
        t = self.t
        if not (t.load or t.pretrained_checkpoint):
            return 0, 0
        why = []  # what the search said about its choice, for a restarted run's line
        path, pretrained = find_source(t, report=lambda line: (why.append(line), print_rank_0(line)))
        persistent = read_metadata(path)["iteration"] if path and not pretrained else 0
        local = self.local.choose(persistent, why) if self.local else None  # collective
        if path is None and local is None:
            print_rank_0(f"> no checkpoint in {t.load}: training from scratch")
            if line := resume_line(t.load, None, 0, why):
                print_rank_0(line)
            return 0, 0
        if local:
            it, consumed = self.local.load(local)
        else:
            if pretrained:  # --pretrained-checkpoint: its weights only, as --finetune
                print_rank_0(f"> no checkpoint in {t.load}: starting from --pretrained-checkpoint {path}")
                t = dataclasses.replace(t, finetune=True)
            it, consumed = load_checkpoint(path, self.model, self.optimizer, self.groups, t, self.device,
                                           self.scheduler)
            self.last_saved = it
        if line := resume_line(t.load, local or path, it, why):
            print_rank_0(line)
        return it, consumed

    def save(self, iteration, consumed, final=False):
        """Save; a failure is counted (save_failures.py): raises CheckpointError only when it ends the run."""
        if self.failures.attempt(lambda: save_checkpoint(self.t.save, iteration, consumed, self.model, self.optimizer,
                                                         self.groups, self.model_cfg, self.t, self.device,
                                                         self.scheduler, self.saver), final, self.saver):
            self.last_saved = iteration

    def after_iteration(self, iteration, consumed):
        """Save on --save-interval; True when a SIGTERM arrived (saved, stop training)."""
        t = self.t
        if t.save and t.save_interval and iteration % t.save_interval == 0:
            self.save(iteration, consumed)
        elif self.local is not None:  # not where a persistent save wrote (Megatron-LM's rule)
            self.local.after_iteration(iteration, consumed)
        if t.exit_signal_handler:
            flag = torch.tensor([float(self._signalled)], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same iteration
            if flag.item() > 0:
                if t.save and self.last_saved != iteration:
                    self.save(iteration, consumed, final=True)
                print_rank_0(f"> exiting at iteration {iteration} on SIGTERM (--exit-signal-handler)")
                return True
        return False

    def finish(self, iteration, consumed):
        """Save the final state unless it was just saved; wait for a background save to commit."""
        if self.t.save and iteration > 0 and self.last_saved != iteration:
            self.save(iteration, consumed, final=True)
        if self.saver is not None:
            self.failures.settle(self.saver, final=True)
