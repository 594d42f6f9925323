"""Layout-free sharded checkpoints: each rank writes its pieces of the global tensors
(pieces.py), atomically, into a directory any layout can read (storage.py)."""
from .pieces import CheckpointError, assemble, local_shard, make_piece, param_rule, whole_piece
from .storage import (
                      CheckpointReader,
                      begin_save,
                      commit,
                      find_checkpoint,
                      iter_dir,
                      rank_file,
                      read_metadata,
                      same_dir,
                      save_global_checkpoint,
                      write_rank_file,
)
