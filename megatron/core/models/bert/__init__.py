"""BERT model."""
from .bert_model import BertModel
