"""TensorIR building blocks shared by the kernel families: code extraction, the magic-number
conversion, int8 byte planes, int8 activations, integer dot products and the compute's name.

A family's computes import from here; no family imports another family.
"""
