"""Decoding: token ids in, hypotheses out, on the model's encode / decode-step protocol.

No files, no vocabularies, no engine: special tokens come in as ids (:mod:`mtkit.config`), options
in one frozen :class:`~mtkit.decoding.options.SearchOptions` per call.

* :mod:`~mtkit.decoding.options`: ``SearchOptions``, ``Hypothesis`` and the model protocol;
* :mod:`~mtkit.decoding.search`: greedy search, sampling, and the one beam loop with its step strategy;
* :mod:`~mtkit.decoding.constrained`: Dynamic Beam Allocation, a strategy of that loop;
* :mod:`~mtkit.decoding.penalties`: length penalties (no torch: the CTranslate2 engine uses them too);
* :mod:`~mtkit.decoding.ensemble`: several models decoded as one;
* :mod:`~mtkit.decoding.forced`: teacher-forced log-probabilities of given targets.

This package imports nothing at load time (``mtkit.decoding.penalties`` must stay importable without
torch), so import its modules directly.
"""
