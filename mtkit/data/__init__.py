"""Data preparation: corpus readers, cleaning, SentencePiece vocabularies and the binarized store."""

from mtkit.data.store import ParallelStore, ParallelStoreWriter
from mtkit.data.vocab import Vocab

__all__ = ["ParallelStore", "ParallelStoreWriter", "Vocab"]
