"""Model definitions built from TransformerConfig."""
