"""Restarts under `torchrun --max-restarts N` (issue 41, item 1): a fresh process group per attempt, and
the start-up line that says where a restarted run resumes.

torchrun restarts every worker of the group when one dies; the new workers run the same command, so
with --save and --load the same directory they load the newest complete checkpoint and go on.

Why our own store: torchrun's workers share the agent's TCPStore across attempts
(TORCHELASTIC_USE_AGENT_STORE), and torch's env:// rendezvous adds no per-attempt prefix to it, assuming
a new store per retry. With gloo the restarted ranks then read the dead attempt's addresses and time out
connecting (torch 2.13: "Gloo connectFullMesh failed ... Connection refused"). Each attempt's keys
therefore live under their own prefix of that store.
"""
import os

import torch.distributed as dist


def restart_attempt() -> int:
    """torchrun's restart count: 0 for the first launch (and without torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def attempt_store(timeout):
    """Under torchrun, a client of the agent's store whose keys are this attempt's only; else None
    (init_process_group's env:// rendezvous is right then)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
                         is_master=False, timeout=timeout)
    return dist.PrefixStore(f"megatron/attempt_{restart_attempt()}/", base)


def resume_line(load, path, iteration, why):
    """The restarted run's start-up line (None in a first launch): which checkpoint and why.
    why: the lines the checkpoint search said about its choice (none: the one the tracker names)."""
    attempt = restart_attempt()
    if attempt == 0:
        return None
    restarts = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "?")
    head = f"> restarted by torchrun (restart {attempt} of --max-restarts {restarts}): "
    if path is None:
        return head + f"no complete checkpoint in --load {load} yet: training from iteration 1"
    reason = "; ".join(line.lstrip("> ") for line in why) or "the newest complete checkpoint, named by the tracker"
    return head + f"resuming from {path} (iteration {iteration}): {reason}"
