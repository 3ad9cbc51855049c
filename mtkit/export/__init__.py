"""Optional exporters, imported only when used (``mtkit export ...``).

ctranslate2 -- a CTranslate2 model directory (``pip install mtkit[export]``), built through
               CTranslate2's own model-spec API, plus mtkit's SentencePiece model(s).
huggingface -- a Hugging Face folder (``pip install mtkit[hf]``): MarianMT or Pegasus, MarianTokenizer.
"""
