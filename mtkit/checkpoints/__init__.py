"""mtkit's checkpoints: the one module that reads, writes and upgrades them, and the torch-free reader that
checks each file first.

    file.py   a ``torch.save`` file (mtkit's checkpoints, COMET's) read without torch and without running
              its code, in work bounded by its size (what the metrics read too)
    io.py     THE checkpoint module: the format, reading it (with its checks: :func:`precheck`), writing it
              (:func:`save_checkpoint`), upgrading older files, :class:`LoadedModel`; an ensemble's models
              share one vocabulary (``check_one_vocabulary``; the model side is
              :class:`mtkit.decoding.ensemble.Ensemble`)

The package sits beside data and metrics, below the engines: io.py builds the model and its vocabulary
(mtkit.model, mtkit.data), the exporters, importers, training and the engines read through it. Importing
the package loads no submodule (and no torch).
"""
