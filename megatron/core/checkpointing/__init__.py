"""Layout-free sharded checkpoints: each rank writes its pieces of the global tensors
(pieces.py), atomically, into a directory any layout can read (storage.py, reading.py)."""
from .agreement import save_step
from .async_save import AsyncSaver, finishing_saves
from .index_reader import IndexedReader, open_reader
from .pieces import CheckpointError, assemble, local_shard, make_piece, param_rule, whole_piece
from .reading import CheckpointReader, find_checkpoint, read_metadata, same_dir
from .storage import begin_save, commit, iter_dir, rank_file, save_global_checkpoint, write_rank_file
