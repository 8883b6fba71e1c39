"""Reading and cleaning corpora: sources of every form, the cleaning rules, tokenizers, the
memory-mapped store of text and token ids. Nothing here imports `nmt.inference`: model scoring of
pairs is handed in by the program that runs it."""
