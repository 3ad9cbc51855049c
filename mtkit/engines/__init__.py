"""The engines: loading a model and running it (what the commands, the server and training share): the
device, mixed precision, loading a checkpoint into (model, vocabulary, config), and the engines that
translate lines.

    device.py              ``auto`` -> cuda or cpu, once for every command and the trainer
    precision.py           the ``precision`` setting -> autocast context and grad scaler
    capabilities.py        what each engine can do (alignments, constraints, devices, quantizations ...),
                           declared once, read without torch; the refusals built from it
    engine.py              :class:`Engine`, the engines' common pipeline (lines in, translations out), its
                           :class:`EngineOptions`; warnings on the ``mtkit`` logger
    torch_engine.py        :class:`TorchEngine`: :mod:`mtkit.decoding` on one model or an ensemble, its
                           constrained decoding (constraints, glossaries) included
    inference.py           :class:`InferenceModel`: a model as search sees it, its weights packed once, owned
    ctranslate2_engine.py  :class:`Ctranslate2Engine`: an exported model in CTranslate2 (never imports torch)
    factory.py             the one place engines are built: :mod:`mtkit.api`'s private helper (the CLI, the server,
                           evaluate, run, validation and distillation load through the API)
    threads.py             how many CPU threads to compute with (what other work leaves free); the start
                           reading a program takes with ``mark_start``
    mbr.py                 minimum-Bayes-risk decoding; the COMET utilities an engine owns
    pair_scoring.py        :class:`PairScorer`: forced decoding of line pairs (``mtkit score``)

Nothing here imports :mod:`mtkit.training`, and importing this package loads no submodule (and no torch).
"""
