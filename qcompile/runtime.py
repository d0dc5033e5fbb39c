"""Loading exported kernels and calling them on PyTorch tensors.

Needs only the ``.so``, its manifest and this package: before loading anything the loader
validates the manifest, checks the ``.so`` against the sha256 it records, and compares the CPU
flags (and, for CUDA, the GPU architecture) it records with this host's, so a wrong or foreign
file is refused with a message, not a crash (:func:`load_kernel` says what this cannot do).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qcompile.errors import ArgumentError, LoadError
from qcompile.kernels import family_of
from qcompile.kernels.base import KernelSpec, PreparedWeights
from qcompile.manifest import Manifest, read_manifest, sha256_of
from targets import cuda, isa

#: The torch device each kind of target preset runs on.
DEVICE_OF_KIND = {"cpu": "cpu", "cuda": "cuda"}


class Kernel:
    """A compiled kernel for one spec and target.

    Use :meth:`prepare` once per weight matrix, then call the kernel per activation::

        k = qcompile.load("out/uniform_b4_g128_k4096_n4096_m1_f32.so")
        w = k.prepare(qweight=qweight, scales=scales, qzeros=qzeros)
        y = k(x, w)
    """

    def __init__(self, path: Path, manifest: Manifest, function, spec: KernelSpec, preset) -> None:
        self.path = path
        self.manifest = manifest
        self.spec = spec
        self.family = family_of(spec)
        self.preset = preset
        self.device = DEVICE_OF_KIND[preset.kind]
        self._function = function
        #: The weight layout the schedule chose (manifest ``layout``); None: the family's default.
        self.layout = manifest.data.get("layout")

    def __repr__(self) -> str:
        return f"Kernel({self.spec.name()!r}, target={self.preset.name!r}, path={str(self.path)!r})"

    @property
    def function(self):
        """The compiled function itself, ``function(x, *prepared.tensors, y)``, with no checks.

        For benchmarks and CUDA-graph capture only: a wrong dtype, shape or device here is a
        crash or a wrong answer, not an error. ``x`` [M, K] and ``y`` [M, N] of the spec's
        dtype, on the kernel's device, contiguous and 64-byte aligned.
        """
        return self._function

    def prepare(self, **tensors) -> PreparedWeights:
        """Convert checkpoint tensors once into the operands this kernel reads.

        For the uniform family: ``qweight`` int32 [K*bits/32, N], ``scales`` fp16/fp32 [G, N],
        ``qzeros`` int32 [G, N*bits/32] (GPTQ layout, torch or numpy), optional ``g_idx`` and
        ``zero_convention`` ("v1" default, or "v2"). The operands are packed into the weight
        layout the kernel's schedule chose (``self.layout``, from the manifest).
        """
        if self.layout is not None:
            tensors = {**tensors, "layout": self.layout}
        return self.family.prepare(self.spec, device=self.device, **tensors)

    def relayout(self, weights: PreparedWeights) -> PreparedWeights:
        """Weights prepared in the family's default layout, packed for this kernel (a copy
        unless the layouts already agree); for callers that share one prepared copy between
        kernels of several M."""
        if self.layout is None and weights.extras.get("layout") is None:
            return weights
        return self.family.relayout(self.spec, weights, self.layout)

    def __call__(self, x, weights: PreparedWeights):
        """``y = x @ W``.

        Parameters
        ----------
        x : torch.Tensor or numpy.ndarray, shape [K] or [M, K], the spec's dtype
            On the kernel's device (CPU for llvm targets).
        weights : PreparedWeights
            From :meth:`prepare` of a kernel with the same spec.

        Returns
        -------
        torch.Tensor (numpy.ndarray if ``x`` was one) of shape [N] or [M, N]
        """
        if weights.extras.get("layout") != self.layout:
            describe = self.family.describe_layout
            raise ArgumentError(
                f"weights are in layout {describe(weights.extras.get('layout'))} but "
                f"{self.spec.name()} reads {describe(self.layout)}: prepare them with this "
                "kernel (kernel.prepare)")
        y = self.family.run(self.spec, self._function, x, weights)
        return y.numpy() if isinstance(x, np.ndarray) else y


def load_kernel(path: str | Path) -> Kernel:
    """Check a kernel library and its manifest, then load it (see :func:`qcompile.load`).

    In order, before anything is loaded: the manifest is validated completely
    (:func:`qcompile.manifest.read_manifest`: types, safe names, sha256, preset consistent with
    the target's kind and mcpu, spec, CPU features consistent with the mcpu), the library's
    sha256 is compared with the manifest's, and what the library needs is compared with this
    host: the CPU flags it records (for CUDA, its host code's) with /proc/cpuinfo's, and for
    CUDA a GPU of the recorded architecture or newer, asked of the driver without loading the
    library. Each refusal is one line: the library, what it needs, what this host lacks.

    What these checks protect against: accidents and mismatched copies, such as a library
    copied to a host without its instruction set (which would die of SIGILL on its first
    call), a manifest of another build, a truncated or edited file, or an old format. What they
    cannot protect against: a ``.so`` is native code, and its manifest is a claim by whoever
    wrote both. A library built by someone you do not trust can hold any instructions and any
    code, whatever a consistent manifest beside it says, and loading it runs its constructors.
    Load only libraries you built, or that someone you trust built, from records you trust.

    Parameters
    ----------
    path : str or Path
        The ``<name>.so``; ``<name>.json`` must be beside it.

    Returns
    -------
    Kernel

    Raises
    ------
    LoadError
        One line saying why the library cannot be loaded here.
    """
    so_path = Path(path)
    if not so_path.is_file():
        raise LoadError(f"no kernel library at {so_path}")
    manifest = read_manifest(so_path)
    actual = sha256_of(so_path)
    if actual != manifest.sha256:
        raise LoadError(
            f"{so_path} does not match its manifest: sha256 {actual[:16]}... but the manifest "
            f"records {manifest.sha256[:16]}...; the file was changed or belongs to another build"
        )
    preset = manifest.target_preset
    _check_host(so_path, manifest)
    from qcompile import _tvm

    try:
        module = _tvm.tvm.runtime.load_module(str(so_path))
        function = module[manifest.function]
    except Exception as error:  # TVM raises its own error types for unloadable libraries
        lines = str(error).strip().splitlines()
        reason = lines[-1] if lines else type(error).__name__
        raise LoadError(f"TVM could not load {so_path}: {reason}") from None
    return Kernel(so_path, manifest, function, manifest.kernel_spec, preset)


def _check_host(so_path: Path, manifest: Manifest) -> None:
    """Refuse (LoadError) when this host lacks a CPU flag or the GPU the library needs."""
    preset = manifest.target_preset
    needed = manifest.cpu_flags
    missing, cpu = isa.missing_flags(needed)
    if missing:
        part = "its host code needs" if preset.kind == "cuda" else "it needs"
        raise LoadError(
            f"{so_path} was built for target {preset.name!r} (mcpu "
            f"{_mcpu(manifest)}), which this host cannot run: {part} the CPU flags "
            f"{' '.join(needed)}; {cpu} lacks {', '.join(missing)}")
    if manifest.cuda_arch is not None:
        supported, reason = cuda.arch_support(manifest.cuda_arch)
        if not supported:
            raise LoadError(f"{so_path} was built for target {preset.name!r} "
                            f"({manifest.cuda_arch}), which this host cannot run: {reason}")


def _mcpu(manifest: Manifest) -> str:
    tvm = manifest.tvm_target
    return tvm.get("mcpu") or tvm.get("host", {}).get("mcpu", "?")
