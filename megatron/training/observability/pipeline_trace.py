"""One iteration's pipeline schedule as it ran (--pipeline-trace): the timeline tools/pipeline_timeline.py draws."""
import json

import torch.distributed as dist

from ...core.pipeline_parallel import default_schedule


def write_pipeline_trace(path, trace, groups, model_cfg, num_micro, iteration, schedule=None):
    """Gather one iteration's (kind, chunk, mb, start, end) per action over groups.pp;
    global rank 0 writes them as JSON for tools/pipeline_timeline.py --trace."""
    spans = [None] * groups.pp_size
    dist.all_gather_object(spans, trace, group=groups.pp)
    if groups.rank == 0:
        V = groups.layout.chunks
        with open(path, "w") as f:
            json.dump({"schedule": schedule or default_schedule(groups.pp_size, V), "P": groups.pp_size, "M": num_micro,
                       "V": V, "iteration": iteration, "ranks": dict(enumerate(spans))}, f)
        print(f"> wrote the pipeline schedule timeline of iteration {iteration} to {path}", flush=True)
