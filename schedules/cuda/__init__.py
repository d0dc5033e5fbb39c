"""Design spaces for CUDA targets, one module per kernel family, and the pieces they share
(:mod:`schedules.cuda.common`)."""
