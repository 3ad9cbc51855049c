"""Exporters: an mtkit model in another engine's format, each imported only when used (``mtkit export ...``).

protocol    -- the one scaffold all of them run: refuse, prepare, build beside, check, rename into place.
ctranslate2 -- a CTranslate2 model directory (``pip install mtkit[export]``), built through
               CTranslate2's own model-spec API, plus mtkit's SentencePiece model(s).
onnx        -- two ONNX graphs, the encoder and one decoding step (``pip install mtkit[onnx]``).
huggingface -- a Hugging Face folder (``pip install mtkit[hf]``): MarianMT or Pegasus, MarianTokenizer.
cache       -- the CTranslate2 export ``--engine ctranslate2`` keeps beside a checkpoint, made on first use.

Each export holds ``mtkit.json`` (:mod:`mtkit.engines.manifest`), and reads the model's weights through the one
weight map (:func:`mtkit.kernels.packed.pack`).
"""
