"""Quantizers: float weights (plus calibration data) in, a kernel family's format out."""
