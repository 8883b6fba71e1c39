"""Inference: decoding over the model and its cache, glossaries, confidence, the translator over
PyTorch and CTranslate2, sentences, documents and scores."""
