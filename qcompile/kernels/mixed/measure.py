"""Valid operands for measuring mixed kernels while tuning.

MetaSchedule fills every operand with random values; the mixed kernel reads x through
``order`` and walks CSR outliers through ``row_ptr`` and ``cols``, so random ones read outside
their buffers. This allocator makes the format's random-but-valid arrays instead
(``MixedFamily.example_tensors``), with the spec's real outlier count.
"""

from __future__ import annotations

import numpy as np


def alloc_arguments(spec_json: str, device, args_info, alloc_repeat: int):
    """LocalRunner's ``f_alloc_argument`` for the spec in ``spec_json`` (bound with partial).

    Returns ``alloc_repeat`` argument lists: x float32 [M, K] (standard normal), the format's
    arrays (as the kernel reads them: byte planes for int8 activations on CPUs, their int32
    words on CUDA, packed in the candidate's weight layout, read from its argument shapes), y
    float32
    [M, N] (zeros).
    """
    import json

    from qcompile import _tvm
    from qcompile.kernels import get_family, spec_from_dict  # imports this module: a cycle
    from qcompile.kernels.layouts import mixed as weight_layout  # with the line above

    spec = spec_from_dict(json.loads(spec_json))
    family = get_family(spec.family)
    # The candidate's layout is in its argument shapes (codes2 [N/T, K2/16, T] when tiled),
    # except for the CUDA int8 kernel's int32 words [K2/16, 1, N] (layout plane_words; CPU int8
    # kernels read uint8 byte planes).
    codes2 = [tuple(info[2]) for info in args_info][2]
    tiled = {3: 2, 5: 3}.get(len(codes2))  # words [N/T, R, T] or byte planes [N/T, U, 1, T, 4]
    if spec.int8_activations and str(args_info[2][1]) == "int32":
        layout = weight_layout.plane_words()
    else:
        layout = weight_layout.n_tiled(codes2[tiled]) if tiled else None
    repeated = []
    for index in range(alloc_repeat):
        rng = np.random.default_rng(index)
        tensors = family.kernel_operands(spec, family.example_tensors(spec, rng), layout)
        arrays = [rng.standard_normal((spec.m, spec.k)).astype(np.float32),
                  *tensors.values(),
                  np.zeros((spec.m, spec.n), dtype=np.float32)]
        shapes = [tuple(info[2]) for info in args_info]
        if shapes != [a.shape for a in arrays]:
            raise ValueError(f"mixed measurement operands {[a.shape for a in arrays]} do not "
                             f"match the workload's arguments {shapes}")
        repeated.append([_tvm.tvm.runtime.tensor(a, device) for a in arrays])
    return repeated
