"""Text to token datasets: offline tokenizers, ``data prepare``, the demo corpus, and the
memory-mapped dataset format with deterministic sampling. Imports no torch."""
