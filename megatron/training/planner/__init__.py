"""Cluster planner: predicted step time, memory and MFU of every layout (docs/planner.md)."""
from .hardware import Cluster, gpu_names, load_calibration, make_cluster
from .predict import Prediction, plan, predict, predict_resolved

__all__ = ["Cluster", "Prediction", "gpu_names", "load_calibration", "make_cluster", "plan", "predict",
           "predict_resolved"]
