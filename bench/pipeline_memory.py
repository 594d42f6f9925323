"""Activation memory a pipeline rank holds under each schedule, measured on the real GPT model.

    PYTHONPATH=. python bench/pipeline_memory.py        # PP4, 8 layers, M 8: 1F1B, interleaved (V 2), ZB-H1, ZB-H2

Four gloo processes run one iteration of the real executor (forward_backward) on a small GPT
(hidden 128, sequence 128, micro batch 2, fp32). After every action the executor hands its
held state to a probe (executor.run_actions, stats["probe"]), which adds up the distinct
storages of every tensor that state keeps alive: the tensors saved in the autograd graphs of
the microbatches waiting for B, and for those waiting for W the saved tensors B did not release
(the weight gradients' inputs) and the gradients B kept (pipeline_parallel/backward_split.py).
Parameters are not counted. The table gives the peak per rank in MiB, next to the peak number of
microbatches held (until B, or until W).
"""
import argparse
import contextlib
import datetime
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SEQ, MICRO, VOCAB = 128, 2, 256
SCHEDULES = (("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1), ("zb_h2", 1), ("zb_v", 2))


def _tensors(value):
    return [t for t in (value if isinstance(value, (tuple, list)) else (value,)) if torch.is_tensor(t)]


def held_storages(outputs, weight_work, skip) -> dict:
    """{storage pointer: bytes} of what the held graphs save and the work waiting for W keeps (its
    graph's saved tensors that B did not release, and the gradients it kept)."""
    found, seen = {}, set()
    stack = [o.grad_fn for o in outputs.values() if o.grad_fn is not None]
    for work in weight_work.values():
        nodes, grads = work.held()
        stack += nodes
        for t in grads:
            found[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        kept = []
        for name in [n for n in dir(node) if n.startswith("_saved_")] + ["saved_tensors"]:
            with contextlib.suppress(RuntimeError, AttributeError):  # freed (or released by B), or none saved
                kept += _tensors(getattr(node, name))
        for t in kept:
            found[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        stack += [n for n, _ in node.next_functions]
    return {p: n for p, n in found.items() if p not in skip}


def _body(groups, M):
    from megatron.core.config import TransformerConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.pipeline_parallel import forward_backward
    from megatron.core.tensor_parallel.initialization import initialize_parameters
    from megatron.training.loop.training import build_model

    def provider(cfg, groups, device, pre_process=True, post_process=True, vp_stage=None):
        return GPTModel(cfg, groups, pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)

    def step(model, batch):
        out = model(batch["tokens"], labels=batch["labels"])
        return {"lm loss": (out, batch["loss_mask"])} if model.post_process else out

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (M, MICRO, SEQ + 1), generator=g)
    batches = [{"tokens": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous(), "loss_mask": torch.ones(MICRO, SEQ)}
               for t in tokens]
    out = {}
    for name, V in SCHEDULES:
        cfg = TransformerConfig(num_layers=8, hidden_size=128, num_attention_heads=4, seq_length=SEQ, vocab_size=VOCAB,
                                hidden_dropout=0.0, attention_dropout=0.0, pipeline_model_parallel_size=groups.pp_size,
                                virtual_pipeline_model_parallel_size=V if name == "interleaved_1f1b" else None)
        cfg.resolve().validate()
        chunked = groups.with_pipeline(cfg.virtual_pipeline_model_parallel_size, name)  # ZB-V: 2P stages in a V
        model = build_model(provider, cfg, chunked, torch.device("cpu"))
        initialize_parameters(model, 1, groups.tp_rank, groups.tp_size)
        skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
        peak = [0]

        def probe(outputs, weight_work, skip=skip, peak=peak):
            peak[0] = max(peak[0], sum(held_storages(outputs, weight_work, skip).values()))
        stats = {"probe": probe}
        forward_backward(model, batches, step, chunked, schedule=name, stats=stats)
        out[name] = (peak[0], stats["peak_in_flight"])
    return out


def main():
    from tests.harness import spawn
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pipeline_memory.md"))
    a = ap.parse_args()
    ranks = spawn(a.pp, _body, a.microbatches, pp=a.pp, schedule="zb_v", timeout=1800)  # zb_v's gradient channel
    rows = []
    for name, V in SCHEDULES:
        mib = " / ".join(f"{ranks[r][name][0] / 2**20:.2f}" for r in range(a.pp))
        held = " / ".join(str(ranks[r][name][1]) for r in range(a.pp))
        rows.append(f"| {name} | {V} | {mib} | {held} |")
    text = "\n".join([
        "# Activation memory held per pipeline rank, real GPT, one iteration", "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- command: `PYTHONPATH=. python bench/pipeline_memory.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"- P = {a.pp}, M = {a.microbatches}; GPT 8 layers, hidden 128, 4 heads, sequence {SEQ}, micro batch {MICRO}, "
        f"vocabulary {VOCAB}, fp32, torch {torch.__version__}",
        "- peak over the iteration of the distinct storages the rank's held graphs save and its work waiting for W "
        "keeps (parameters excluded); microbatches held counted per chunk", "",
        "| schedule | V | peak held MiB per rank | peak microbatches held per rank |", "|---|---|---|---|", *rows, ""])
    print(text)
    with open(a.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
