"""What every kernel family provides: a frozen spec (the kernel's identity and cache key), the
TensorIR compute definition, and the conversion of checkpoint tensors into kernel operands."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from qcompile import tensors as tensor_checks
from qcompile.errors import ArgumentError, FormatError, SpecError
from qcompile.tensors import kernel_ready

#: Bump to invalidate every stored digest at once (a change in how specs are serialised).
SPEC_SCHEMA_VERSION = 1

#: The PrimFunc attribute that carries the spec's JSON, so a workload names its own spec.
SPEC_ATTR = "qcompile.spec"

#: The most elements one buffer of a kernel may hold. TVM 0.27 gives a shape whose dimensions
#: are below 2**31 int32 extents and flattens every buffer to one extent of the same type, so a
#: buffer of 2**31 elements or more does not compile ("Literal value 2147483648 exceeds range
#: of int32", tried on a 32768 x 65536 int8 copy; 32767 x 65536 compiles). Each family checks
#: its operands, and the buffers its computes always materialize whole, when a spec is made.
MAX_BUFFER_ELEMENTS = 2**31 - 1


def check_positive_ints(spec, names: tuple[str, ...]) -> None:
    """Raise ``SpecError`` unless every field in ``names`` is an int (not a bool) above 0.

    Parameters
    ----------
    spec : KernelSpec
        The spec being made (from its ``__post_init__``).
    names : tuple of str
        Its fields to check ("k", "n", "m"); the message names the field in capitals.
    """
    for field in names:
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SpecError(f"{field.upper()} must be a positive integer; got {value!r}")


def check_buffer_sizes(buffers: dict[str, tuple[int, ...]]) -> None:
    """Raise ``SpecError`` naming the first buffer over :data:`MAX_BUFFER_ELEMENTS`.

    Parameters
    ----------
    buffers : dict of str to tuple of int
        ``{"x [M, K]": (m, k), ...}``: each buffer, named with its dimensions, and its shape.

    Raises
    ------
    qcompile.errors.SpecError
        "<buffer> = <dims> = <count> elements exceeds the limit of 2147483647 (2**31 - 1)...".
    """
    for name, shape in buffers.items():
        count = 1
        for extent in shape:
            count *= extent
        if count > MAX_BUFFER_ELEMENTS:
            dims = " x ".join(map(str, shape))
            raise SpecError(f"{name} = {dims} = {count} elements exceeds the limit of "
                            f"{MAX_BUFFER_ELEMENTS} (2**31 - 1): TVM indexes every buffer with "
                            "int32, so no kernel of this size compiles")


@functools.lru_cache(maxsize=4096)
def _digest(spec: KernelSpec, compute_version: int, schema: int) -> str:
    payload = {"schema": schema, "compute_version": compute_version, **spec.to_dict()}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class KernelSpec:
    """Base class of kernel specs: frozen dataclasses validated in ``__post_init__``.

    Subclasses set ``family`` and ``compute_version``; bumping ``compute_version`` whenever the
    TensorIR changes gives the kernel a new digest, so records tuned for the old TensorIR are
    never replayed on the new one.
    """

    family: ClassVar[str] = ""
    compute_version: ClassVar[int] = 1

    def name(self) -> str:
        """Readable, unique per spec; used for symbols and file names."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The spec's fields plus its family, JSON-ready."""
        return {"family": self.family, **{f.name: getattr(self, f.name) for f in fields(self)}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """sha256 over the sorted JSON of the fields, the compute version and the schema version
        (computed once per spec: every kernel call checks it, and JSON plus sha256 cost about
        50 µs, a tenth of a small CPU GEMV)."""
        return _digest(self, self.compute_version, SPEC_SCHEMA_VERSION)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelSpec:
        data = dict(data)
        family = data.pop("family", cls.family)
        if family != cls.family:
            raise SpecError(f"spec is for family {family!r}, not {cls.family!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown {cls.family} spec fields {unknown}; known: {sorted(known)}")
        return cls(**data)

    def func_attrs(self) -> dict[str, Any]:
        """PrimFunc attributes every compute definition sets: symbol, noalias, the spec."""
        return {"global_symbol": self.name(), "tirx.noalias": True, SPEC_ATTR: self.to_json()}


class GroupsAlongK:
    """Mixin of specs with ``k`` and ``group_size`` (rows of K per group; -1: the whole K)."""

    @property
    def groups(self) -> int:
        """G: groups along K per column (their scales, zero-points, alphas, biases...)."""
        return 1 if self.group_size == -1 else self.k // self.group_size

    @property
    def effective_group_size(self) -> int:
        """Rows of K per group (K itself for group_size -1)."""
        return self.k if self.group_size == -1 else self.group_size


@dataclass(frozen=True)
class PreparedWeights:
    """Weights converted once into the operands a compiled kernel reads.

    Attributes
    ----------
    spec_digest : str
        Digest of the spec they were prepared for; a kernel refuses weights of another spec.
    tensors : tuple of torch.Tensor
        The operands in the kernel's argument order (between the activation and the output);
        contiguous, 64-byte aligned, on the kernel's device.
    names : tuple of str
        The operands' names, for error messages.
    extras : dict
        Family-specific data applied outside the compiled kernel (a bias, say).
    """

    spec_digest: str
    tensors: tuple
    names: tuple[str, ...]
    extras: dict

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


class KernelFamily:
    """A kernel family: subclasses implement the hooks below for their spec type."""

    name: ClassVar[str] = ""
    spec_type: ClassVar[type[KernelSpec]] = KernelSpec

    def add_cli_arguments(self, group) -> None:
        """Add this family's own ``qcompile tune/build`` flags to an argparse group.

        The generic flags (--shape, --bits, --group-size, --batch, --dtype) exist already; a
        family adds only what its spec needs beyond them. Flag names must not collide across
        families (they share one parser).
        """

    def spec_from_cli(self, args, *, k: int, n: int) -> KernelSpec:
        """The spec named by parsed command-line ``args`` (``k``, ``n`` from --shape)."""
        raise NotImplementedError

    def checkpoint_tensors(self, spec: KernelSpec, **tensors):
        """Checkpoint tensors, checked against ``spec``, as the family's format holds them."""
        raise NotImplementedError

    def quantize(self, spec: KernelSpec, weight, **options):
        """Float W [K, N] (``nn.Linear.weight.T``) -> the family's format, with its quantizer
        (qcompile/quantize/)."""
        raise NotImplementedError

    def prepare(self, spec: KernelSpec, device: str = "cpu", **tensors) -> PreparedWeights:
        """Checkpoint tensors -> :class:`PreparedWeights`."""
        raise NotImplementedError

    def measure_arguments(self, spec: KernelSpec):
        """MetaSchedule's ``f_alloc_argument`` for measuring ``spec`` while tuning, or None.

        None (the default) lets MetaSchedule fill every operand with random values. A family
        whose operands index memory (offsets, permutations) returns a picklable function
        ``(device, args_info, alloc_repeat) -> list of argument lists`` that makes valid ones.
        """
        return None

    #: For families with weight layouts: the operand whose int8-activation byte planes
    #: replace its 2-D int32 words (so ``relayout`` knows whether they are split yet).
    codes_operand: ClassVar[str] = ""

    def kernel_operands(self, spec: KernelSpec, by_name: dict, layout: dict | None) -> dict:
        """The format's operands (torch, by name) -> the kernel's: byte planes for an
        ``int8_activations`` spec, then packed into ``layout``. Families with layouts only."""
        raise NotImplementedError(f"the {self.name} family has no weight layouts")

    def describe_layout(self, layout: dict | None) -> str:
        """A layout in words, for messages."""
        return str(layout)

    def relayout(self, spec: KernelSpec, prepared: PreparedWeights,
                 layout: dict | None) -> PreparedWeights:
        """``prepared`` (the format's layout) packed into ``layout``: new tensors, same extras
        (:meth:`kernel_operands`; a no-op when the layouts agree and nothing is to split)."""
        from dataclasses import replace


        current = prepared.extras.get("layout")
        by_name = dict(zip(prepared.names, prepared.tensors, strict=True))
        planes_needed = (getattr(spec, "int8_activations", False)
                         and by_name[self.codes_operand].dim() == 2)
        if current == layout and not planes_needed:
            return prepared
        if current is not None:
            raise FormatError(f"weights already packed as {self.describe_layout(current)}; "
                              "relayout starts from the format's layout")
        by_name = self.kernel_operands(spec, by_name, layout)
        return replace(prepared, tensors=tuple(kernel_ready(by_name[n]) for n in prepared.names),
                       extras={**prepared.extras, "layout": layout})

    @staticmethod
    def _bias(spec: KernelSpec, bias):
        """A bias as float32 [N] torch tensor, checked."""
        import torch

        bias = tensor_checks.to_torch("bias", bias)
        if bias.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            got = str(bias.dtype).removeprefix("torch.")
            raise FormatError(f"bias must be float16, bfloat16 or float32; got {got}")
        if tuple(bias.shape) != (spec.n,):
            raise FormatError(f"bias must have shape [N]=({spec.n},); got {tuple(bias.shape)}")
        return bias.detach().to(torch.float32).contiguous()

    def bytes_read(self, spec: KernelSpec) -> int:
        """Every byte one call must read (weights, scales, activations): the GB/s numerator."""
        raise NotImplementedError

    def example_tensors(self, spec: KernelSpec, rng: np.random.Generator) -> dict[str, Any]:
        """Random checkpoint tensors of the right format, for tests and benchmarks."""
        raise NotImplementedError

    def reference_weight(self, spec: KernelSpec, **tensors) -> np.ndarray:
        """The dequantized weight W [K, N], float32, from checkpoint tensors."""
        raise NotImplementedError

    def reference(self, spec: KernelSpec, x: np.ndarray, **tensors) -> np.ndarray:
        """float64 reference output of ``x`` for checkpoint tensors: dequantize, then matmul."""
        raise NotImplementedError

    def run(self, spec: KernelSpec, function, x, prepared: PreparedWeights):
        """Call the compiled ``function`` on ``x`` (torch or numpy) and return a torch tensor.

        Two optional ``prepared.extras`` apply around the call: ``"perm"`` (int64 [K], act_order's
        offline reorder) gathers x's columns before it, ``"bias"`` (float32 [N]) is added after.
        """
        import torch


        permutation = prepared.extras.get("perm")
        if permutation is not None:
            x = tensor_checks.to_torch("x", x)
            if x.dim() not in (1, 2) or x.shape[-1] != spec.k:
                raise ArgumentError(f"x must have shape [{spec.k}] or [{spec.m}, {spec.k}] "
                                    f"(M={spec.m}, K={spec.k}); got {list(x.shape)}")
            x = x[..., permutation]
        if prepared.spec_digest != spec.digest():
            raise ArgumentError(
                f"weights were prepared for another spec (digest {prepared.spec_digest[:12]}); "
                f"this kernel is {spec.name()} ({spec.digest()[:12]}): prepare them with it"
            )
        device = prepared.tensors[0].device if prepared.tensors else torch.device("cpu")
        x2d, squeeze = tensor_checks.activation(x, rows=spec.m, cols=spec.k, dtype=spec.dtype,
                                                device=device)
        y = torch.empty((spec.m, spec.n), dtype=x2d.dtype, device=device)
        function(x2d, *prepared.tensors, y)
        bias = prepared.extras.get("bias")
        if bias is not None:
            y.add_(bias)
        return y[0] if squeeze else y
