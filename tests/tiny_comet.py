"""A tiny COMET model written the way unbabel-comet's releases are laid out (``hparams.yaml``,
``checkpoints/model.ckpt`` a Lightning checkpoint, the encoder's config and tokenizer in a folder that
``pretrained_model`` names): a random 2-layer XLM-R with a real SentencePiece tokenizer saved by
``save_pretrained``, so that the real loading and scoring paths run without the hub."""

from __future__ import annotations

from pathlib import Path

import yaml

HPARAMS = {
    "regression_metric": {"layer_transformation": "sparsemax", "layer_norm": False, "pool": "avg",
                          "hidden_sizes": [24, 12], "activations": "Tanh", "final_activation": None},
    "referenceless_regression_metric": {"layer_transformation": "softmax", "layer_norm": True, "pool": "avg",
                                        "hidden_sizes": [20], "activations": "Tanh", "final_activation": None},
    "unified_metric": {"layer_transformation": "sparsemax", "layer_norm": False, "pool": "cls",
                       "hidden_sizes": [24], "activations": "Tanh", "final_activation": "sigmoid",
                       "input_segments": ["mt", "src", "ref"], "word_level_training": False},
}
SENTENCES = ["A man is riding a bicycle down the street.", "Ein Mann fährt mit dem Fahrrad die Straße hinunter.",
             "Two dogs play in the snow.", "Zwei Hunde spielen im Schnee.", "A child eats an apple at the table.",
             "Ein Kind isst einen Apfel am Tisch.", "The women are walking on the beach at sunset.",
             "Die Frauen gehen bei Sonnenuntergang am Strand spazieren."]


def write_encoder(folder: Path, max_positions: int = 40) -> Path:
    """A tiny XLM-R config and tokenizer (SentencePiece trained on a few sentences) in ``folder``."""
    import io

    import sentencepiece as spm
    from transformers import XLMRobertaConfig, XLMRobertaTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES * 20), model_writer=model, vocab_size=120,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2)
    (folder / "spm.model").write_bytes(model.getvalue())
    tokenizer = XLMRobertaTokenizer(vocab_file=str(folder / "spm.model"))
    tokenizer.save_pretrained(folder)
    (folder / "spm.model").unlink()
    XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=max_positions, type_vocab_size=1,
                     pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=tokenizer.eos_token_id).save_pretrained(folder)
    return folder


def write_tiny_comet(folder: Path, kind: str = "regression_metric", seed: int = 0) -> Path:
    """A COMET model of class ``kind`` in ``folder`` (random weights, layer-mix weights spread so that
    sparsemax zeroes some); returns ``folder``."""
    import torch
    from transformers import AutoConfig

    from mtkit.metrics.comet import _hparams, _network

    encoder = write_encoder(folder / "encoder")
    hparams = {"class_identifier": kind, "encoder_model": "XLM-RoBERTa", "pretrained_model": str(encoder),
               "layer": "mix", "dropout": 0.1, "nr_frozen_epochs": 0.3, "keep_embeddings_frozen": True,
               "batch_size": 16, "load_pretrained_weights": True, **HPARAMS[kind]}
    torch.manual_seed(seed)
    network = _network(_hparams(hparams, "tiny"), AutoConfig.from_pretrained(encoder), "cpu")
    with torch.no_grad():
        for k, p in enumerate(network.layerwise_attention.scalar_parameters):
            p.fill_(0.9 * k - 0.6)
        network.layerwise_attention.gamma.fill_(1.3)
        for p in network.encoder.parameters():  # far from transformers' init (std 0.02), under which every
            if p.dim() == 2:  # sentence looks alike; the layer norms left at 1 and 0
                p.normal_(0.0, 0.5)
        for p in network.estimator.parameters():
            p.normal_(0.0, 0.5)
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": 0, "global_step": 0, "pytorch-lightning_version": "2.6.0",
                "state_dict": network.state_dict(), "hparams_name": "kwargs", "hyper_parameters": hparams},
               folder / "checkpoints" / "model.ckpt")
    (folder / "hparams.yaml").write_text(yaml.safe_dump(hparams))
    return folder
