"""What training and inference share: the device, mixed precision, loading a checkpoint into
(model, vocabulary, config), and the engines that translate lines.

    device.py              ``auto`` -> cuda or cpu, once for every command and the trainer
    precision.py           the ``precision`` setting -> autocast context and grad scaler
    checkpoint.py          reading checkpoints: checks, run directories, :class:`LoadedModel`
    engine.py              :class:`LineTranslator`, the engines' common pipeline (lines in, translations out)
    torch_engine.py        :class:`Translator`: :mod:`mtkit.decoding` on one model or an ensemble
    inference.py           :class:`InferenceModel`: a model as search sees it, its weights packed once, owned
    torch_constrained.py   the torch engine's constrained decoding (constraints, glossaries)
    ensemble.py            ``check_one_vocabulary``: an ensemble's models share one vocabulary
                           (the model side is :class:`mtkit.decoding.ensemble.Ensemble`)
    ctranslate2_engine.py  :class:`Ctranslate2Translator`: an exported model in CTranslate2 (never imports torch)

Nothing here imports :mod:`mtkit.training`, and importing this package loads no submodule (and no torch).
"""
