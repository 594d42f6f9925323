"""GPT model."""
from .gpt_model import GPTModel
