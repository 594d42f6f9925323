"""A 3D-parallel (tensor x pipeline x data) GPT/BERT pretraining framework on PyTorch."""
__version__ = "0.1.0"
