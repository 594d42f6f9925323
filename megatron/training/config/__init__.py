"""The CLI and the training configuration: flags generated from dataclass fields, their checks, and
the one resolution of derived values."""
