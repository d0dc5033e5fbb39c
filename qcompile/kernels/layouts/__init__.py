"""Weight layouts, one module per family: the descriptors a variant's schedule or compute
chooses (``n_tiled``, ``plane_words``, ``mma_tiles``, ``rotated_chunks``), how to read them back
from a scheduled function, and how ``prepare`` packs the arrays for them."""
