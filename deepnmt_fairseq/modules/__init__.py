"""Plain-PyTorch mechanisms, one concept per module, no fairseq imports."""
