"""The BERT fine-tuning tasks' data (one module each: sst2, stsb, conll2003, squad), read from $LM_DATA_DIR
and encoded into fixed-length rows of WordPiece ids (common.py: packing, and deterministic batches)."""
