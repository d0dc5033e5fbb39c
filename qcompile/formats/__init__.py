"""Quantized weight formats: bit packing, and each format's pack / unpack / reference math."""
