"""The benchmark harness: what every job and study in tools/ measures with.

One concept per module, in the order a benchmark uses them:

``cpu_timing``   wall-clock timing on the CPU: warm-up, blocks of calls, interleaved rounds
``cuda_timing``  CUDA events and CUDA-graph timing with weights rotating past the L2 cache
``bandwidth``    the machine's read and copy bandwidth (CPU and GPU), the denominator of GB/s
``loading``      kernels through qcompile's kernel cache (tuned record, prebuilt, untuned)
``reference``    the float64 check every output (ours and the peers') passes before timing
``peers``        the kernels we compare with (torch, llama.cpp, humming-kernels)
``llama_cpp``    llama.cpp's CPU mul_mat: ggml built on demand into a cache, our C harness
``random_gptq``  a random GPTQ Llama checkpoint written fast (codes drawn, not quantized)
``llama_bench``  llama.cpp's llama-bench on a GGUF of a transformers Llama, built on demand
``models``       whole-model engines: ours, transformers dense, humming-kernels' layers
``decode``       a model's decode steps over a static KV cache (CUDA graphs), prefill, profile
``results``      JSON result files: date, device, command, medians, ratios
``product``      the one module that imports qcompile internals beyond its public surface
``cli``          argument parsing shared by the entries (shapes, comma lists)

Entries run as ``python tools/<entry>.py`` (or ``tools/studies/<study>.py``); each puts the
repository root on ``sys.path`` first, so every one imports ``tools.harness`` the same way.
"""
