"""Design spaces for CPU (``llvm``) targets, one module per kernel family."""
