"""The planner against published measurements: Narayanan et al. 2021 Table 1 (narayanan2021.toml).

Each row is predicted with the paper's model, TP, PP, GPU count and batch size, fp16/bf16,
unfused attention (fused softmax, explicit scores) and full recompute; the paper does not list the
micro batch size in Table 1, so MICRO_BATCH is used for every row. DP = GPUs / (TP x PP).
"""
import os

from ...core.parallel_layout import ParallelLayout
from .hardware import load_toml, make_cluster
from .predict import predict

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "narayanan2021.toml")
MICRO_BATCH = 1


def load_table(path=TABLE) -> dict:
    return load_toml(path)


def row_flags(table, row, micro_batch=MICRO_BATCH) -> list[str]:
    """pretrain_gpt.py flags of one Table 1 row."""
    _, heads, hidden, layers, tp, pp, gpus, batch = row[:8]
    s = table["seq_length"]
    return ["--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads", str(heads),
            "--seq-length", str(s), "--max-position-embeddings", str(s), "--vocab-size", str(table["vocab_size"]),
            "--global-batch-size", str(batch), "--micro-batch-size", str(micro_batch),
            "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--bf16", "--attention-backend", "unfused", "--recompute-granularity", "full"]


def validate_table(table=None, micro_batch=MICRO_BATCH) -> list[dict]:
    """Per row: {'params', 'gpus', 'layout', 'published', 'predicted', 'error' (relative), 'prediction'}."""
    table = table or load_table()
    out = []
    for row in table["rows"]:
        tp, pp, gpus = row[4], row[5], row[6]
        cluster = make_cluster(table["gpu"], gpus)
        p = predict(row_flags(table, row, micro_batch), cluster)
        out.append({"params": row[0], "gpus": gpus, "layout": f"TP{tp} PP{pp} DP{ParallelLayout(gpus, tp, pp=pp).dp}",
                    "batch": row[7], "published": row[8], "predicted": p.tflops_per_gpu,
                    "error": p.tflops_per_gpu / row[8] - 1, "prediction": p})
    return out


def markdown(results) -> str:
    lines = ["| params (B) | GPUs | layout | batch | published TFLOP/s/GPU | predicted | error | bubble | memory GB |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        p = r["prediction"]
        lines.append(f"| {r['params']} | {r['gpus']} | {r['layout']} | {r['batch']} | {r['published']} | "
                     f"{r['predicted']:.1f} | {100 * r['error']:+.1f}% | {100 * p.step.bubble:.1f}% | "
                     f"{p.memory_bytes / 1e9:.1f} |")
    return "\n".join(lines)
