"""The FP8 training recipes of Megatron-Core's ``--fp8-recipe`` (Transformer Engine's scaling recipes): the bytes each
adds to the cast kernels, the saved FP8 copies and the cached FP8 weights, and the GPUs each runs on.

Sources (read for this module): Megatron-Core 0.16.1 ``megatron/core/transformer/transformer_config.py``
(``fp8_recipe: Literal['tensorwise', 'delayed', 'mxfp8', 'blockwise', 'custom'] = "delayed"``) and
``megatron/core/fp8_utils.py`` ``get_fp8_recipe`` (delayed -> TE ``DelayedScaling``, tensorwise ->
``Float8CurrentScaling``, blockwise -> ``Float8BlockScaling``, mxfp8 -> ``MXFP8BlockScaling``); Transformer Engine
2.20.2: ``transformer_engine/common/recipe/__init__.py`` (the recipes), ``transformer_engine/pytorch/quantization.py``
(``check_recipe_support``: delayed/current scaling need compute capability 8.9+, MXFP8 10.x (not 12.0+), FP8 block
scaling 9.0+ with CUDA 12.9), ``transformer_engine/pytorch/module/linear.py`` (the input kept for the weight gradient
holds its column-wise data only: ``update_usage(rowwise_usage=False, columnwise_usage=True)``) and
``transformer_engine/pytorch/csrc/quantizer.cpp`` (the data and scale-inverse tensors each quantizer allocates:
``Float8CurrentScalingQuantizer::quantize_impl`` runs ``nvte_compute_amax`` over the input, then
``nvte_compute_scale_from_amax``, then the cast; ``MXFP8Quantizer::get_scale_shape``;
``Float8BlockQuantizer::get_scale_shape``).

- delayed: one per-tensor scale from an amax history; the cast-transpose writes the FP8 data and its transpose and
  computes the amax in the same pass (wattcast's FP8 model until now, unchanged).
- tensorwise (current scaling): the same cast, after a separate amax kernel over the whole input (one more read of
  it) and a one-element scale kernel.
- mxfp8: one E8M0 scale (1 B) per 32 consecutive elements, row-wise and column-wise copies each with its own scales
  (a block's scale runs along the GEMM's contraction dimension, so the column-wise copy is quantised anew, not the
  row-wise bytes re-laid); scale tensors padded as ``MXFP8Quantizer::get_scale_shape``.
- blockwise: DeepSeek-V3-style blocks, fp32 scales: activations and gradients 1x128 (``x_block_scaling_dim=1``,
  ``grad_block_scaling_dim=1``), weights 128x128 (``w_block_scaling_dim=2``); row-wise and column-wise copies, scale
  tensors shaped as ``Float8BlockQuantizer::get_scale_shape``.
- deepseek (wattcast's name, not Megatron-Core's): DeepSeek-V3's own FP8 framework (tech report arXiv 2412.19437):
  the fine-grained quantisation of Sec. 3.3.2 (1x128 activation tiles, 128x128 weight blocks: blockwise's scales and
  casts) plus its low-precision storage and communication of Sec. 3.3.3, as stated there: the input of the linear after
  the attention operator kept once, in E5M6 (:data:`E5M6_BYTES`), for both the attention's backward and that linear's
  weight gradient; the MoE SwiGLU inputs cached in FP8 and their outputs recomputed in the backward; the activation
  before the MoE up-projections quantised to FP8 before the dispatch; and, with the RMSNorm / MLA up-projection
  recomputation of Sec. 3.2.3 ("eliminating the need to persistently store their output activations"), no FP8 copy of
  a recomputed output kept either (re-made with it). The graph side: featurize/op_graph.py ``deepseek_storage``.

The GEMMs' own time is the FP8 GEMM surrogate's for every recipe: no measured per-recipe GEMM speed is in the data.
"""

from __future__ import annotations

import re

#: Megatron-Core 0.16.1's --fp8-recipe choices wattcast models ("custom", a user's quantizer factory, is not)
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise", "deepseek")
#: bytes per element of DeepSeek-V3's customised E5M6 format (1 sign + 5 exponent + 6 mantissa bits = 12 bits), in
#: which it keeps the inputs of the linear after the attention operator (tech report arXiv 2412.19437 Sec. 3.3.3 (1))
E5M6_BYTES = 1.5
#: Megatron-Core's default (transformer_config.py: ``fp8_recipe = "delayed"``)
DEFAULT_FP8_RECIPE = "delayed"

#: MXFP8: elements per scale block and bytes per scale (E8M0): csrc/quantizer.cpp ``MXFP8_BLOCK_SIZE = 32``, scale
#: tensors allocated as uint8
MXFP8_BLOCK = 32
MXFP8_SCALE_BYTES = 1
#: FP8 block scaling: block length and bytes per scale (fp32): csrc/quantizer.cpp Float8BlockQuantizer ``kBlockLen =
#: 128``, scale tensors allocated as torch::kFloat32
BLOCKWISE_BLOCK = 128
BLOCKWISE_SCALE_BYTES = 4
#: Float8CurrentScaling's scale kernel (``nvte_compute_scale_from_amax``): reads the fp32 amax, writes the fp32 scale
#: and its inverse (csrc/quantizer.cpp quantize_impl sets fp32 amax and scale buffers of shape {1})
CURRENT_SCALE_KERNEL_BYTES = 12


class FP8RecipeError(ValueError):
    """An FP8 recipe wattcast does not know, or one the GPU cannot run."""


def checked_fp8_recipe(recipe) -> str:
    """``recipe`` lower-cased if it is one of :data:`FP8_RECIPES`, else an FP8RecipeError listing them."""
    r = str(recipe).strip().lower()
    if r not in FP8_RECIPES:
        raise FP8RecipeError(f"unknown --fp8-recipe {recipe!r}; use one of {', '.join(FP8_RECIPES)} (Megatron-Core's "
                             "names, and deepseek: DeepSeek-V3's framework; 'custom' quantizer factories are not modelled)")
    return r


def quantizer_of(recipe: str) -> str:
    """The scaling a recipe's casts and copies use: DeepSeek-V3's (``deepseek``) is blockwise's 1x128 / 128x128 fp32
    scales (tech report Sec. 3.3.2, which Megatron-Core's blockwise recipe follows); the others their own."""
    return "blockwise" if recipe == "deepseek" else recipe


def _ceildiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def _roundup(a: int, b: int) -> int:
    return _ceildiv(a, b) * int(b)


def mxfp8_scale_bytes(m: int, k: int, *, columnwise: bool) -> int:
    """Bytes of the E8M0 scales of an (m, k) MXFP8 tensor's row-wise or column-wise copy: TE 2.20
    ``MXFP8Quantizer::get_scale_shape`` (row-wise roundup(m, 128) x roundup(k / 32, 4); column-wise
    roundup(m / 32, 4) x roundup(k, 128)). TE requires m and k divisible by 32 (Megatron pads a grouped GEMM's
    tokens); a dimension that is not is rounded up here."""
    if columnwise:
        return _roundup(_ceildiv(m, MXFP8_BLOCK), 4) * _roundup(k, 128) * MXFP8_SCALE_BYTES
    return _roundup(m, 128) * _roundup(_ceildiv(k, MXFP8_BLOCK), 4) * MXFP8_SCALE_BYTES


def blockwise_scale_bytes(m: int, k: int, *, columnwise: bool, block_dim: int = 1) -> int:
    """Bytes of the fp32 scales of an (m, k) FP8-block-scaled tensor's row-wise or column-wise copy: TE 2.20
    ``Float8BlockQuantizer::get_scale_shape`` with 128-element blocks, ``block_dim`` 1 (1x128: activations and
    gradients) or 2 (128x128: weights)."""
    b = BLOCKWISE_BLOCK
    if block_dim == 2:
        rows, cols = (_ceildiv(k, b), _roundup(_ceildiv(m, b), 4)) if columnwise else (_ceildiv(m, b), _roundup(_ceildiv(k, b), 4))
    elif block_dim == 1:
        rows, cols = (_ceildiv(m, b), _roundup(k, 4)) if columnwise else (_ceildiv(k, b), _roundup(m, 4))
    else:
        raise FP8RecipeError(f"block_dim must be 1 or 2, got {block_dim!r}")
    return rows * cols * BLOCKWISE_SCALE_BYTES


def scale_bytes(recipe: str, m: int, k: int, *, columnwise: bool, weight: bool = False) -> int:
    """Scale bytes of one copy (row-wise or column-wise) of an (m, k) tensor quantised under ``recipe``: the block
    scales of mxfp8 and blockwise (and deepseek's); 0 for the per-tensor recipes (one fp32 scale per tensor, not
    counted)."""
    recipe = quantizer_of(recipe)
    if recipe == "mxfp8":
        return mxfp8_scale_bytes(m, k, columnwise=columnwise)
    if recipe == "blockwise":
        return blockwise_scale_bytes(m, k, columnwise=columnwise, block_dim=2 if weight else 1)
    return 0


def weight_scale_bytes_per_param(recipe: str) -> float:
    """Scale bytes per weight element of the row-wise and column-wise FP8 weight copies together, unpadded (exact
    for weights whose dims are multiples of 128): mxfp8 2 x 1 B / 32; blockwise (128x128 blocks) 2 x 4 B / 128^2."""
    recipe = quantizer_of(recipe)
    if recipe == "mxfp8":
        return 2.0 * MXFP8_SCALE_BYTES / MXFP8_BLOCK
    if recipe == "blockwise":
        return 2.0 * BLOCKWISE_SCALE_BYTES / (BLOCKWISE_BLOCK * BLOCKWISE_BLOCK)
    return 0.0


def weight_copy_bytes_per_param(recipe: str, transpose: bool = True) -> float:
    """Bytes per parameter of the FP8 weight copies Transformer Engine caches between steps: the FP8 data and its
    transpose / column-wise copy (2 B) plus their block scales. ``transpose`` False (a GPU where
    :func:`fp8_writes_transpose` is False): the per-tensor recipes (delayed, tensorwise) keep the data alone, 1 B
    (TE 2.20.2 csrc/quantizer.cpp l. 361-375: ``with_transpose = columnwise_usage && !is_non_tn_fp8_gemm_supported``,
    the data kept for column-wise use instead); mxfp8 / blockwise always keep both copies."""
    if recipe in PER_TENSOR_RECIPES and not transpose:
        return 1.0
    return 2.0 + weight_scale_bytes_per_param(recipe)


def activation_cast_copies(recipe: str, *, transpose: bool = True, train: bool = True) -> int:
    """FP8 copies (1 B an element each) a linear layer's input cast writes: the row-wise data for the forward GEMM and,
    in training, the transpose / column-wise copy the weight-gradient GEMM reads. Inference writes the row-wise data
    alone, every recipe: TE 2.20.2 ``pytorch/module/linear.py`` l. 399 ``backward_needs_input = is_grad_enabled and
    weight_requires_grad`` and l. 524-531 ``input_quantizer.set_usage(rowwise=True, columnwise=backward_needs_input
    ...)`` (``layernorm_linear.py`` l. 200 and l. 226-229 alike; ``grouped_linear.py`` l. 461-463), and under
    ``torch.no_grad`` ``is_grad_enabled`` is False; ``csrc/quantizer.cpp`` then allocates and writes no column-wise
    data or scales (Float8 l. 375 ``with_transpose = columnwise_usage && ...``, MXFP8 l. 1525-1536, FP8 block
    l. 1080-1090: ``if (columnwise_usage)``). Training: 2, or 1 for a per-tensor recipe on a GPU without the
    transpose (:func:`fp8_writes_transpose`)."""
    if not train or (recipe in PER_TENSOR_RECIPES and not transpose):
        return 1
    return 2


def cast_scale_bytes(recipe: str, m: int, k: int, *, train: bool = True) -> int:
    """Scale bytes an (m, k) activation cast writes: the row-wise copy's block scales and, in training, the
    column-wise copy's (inference writes no column-wise copy: :func:`activation_cast_copies`); 0 for the per-tensor
    recipes."""
    return scale_bytes(recipe, m, k, columnwise=False) + (scale_bytes(recipe, m, k, columnwise=True) if train else 0)


def inference_weight_bytes_per_param(recipe: str) -> float:
    """Bytes per parameter of an FP8 linear weight held for inference: the row-wise FP8 data (1 B) and its row-wise
    block scales (mxfp8 1 B / 32, blockwise 4 B / 128^2; none for the per-tensor recipes), no column-wise copy or
    transpose. TE 2.20.2: FP8 parameters made under ``torch.no_grad`` are quantized row-wise only
    (``pytorch/module/base.py`` l. 1847 ``quantizer.set_usage(rowwise=True, columnwise=torch.is_grad_enabled())``)
    and used as they are (l. 836-845 ``quantize_weight``: an already-quantized weight only updates the usages its
    quantizer asks for); a bf16 weight cast in the forward asks for no column-wise usage without grad
    (``linear.py`` l. 563-571 ``columnwise_usage = is_grad_enabled and ...``; ``layernorm_linear.py`` l. 346-348;
    ``layernorm_mlp.py`` l. 511-521)."""
    return 1.0 + weight_scale_bytes_per_param(recipe) / 2.0


#: the recipes with one scale per tensor (TE's Float8Quantizer / Float8CurrentScalingQuantizer), whose column-wise
#: copy is a transpose of the row-wise data, written only where the GEMM needs it (:func:`fp8_writes_transpose`)
PER_TENSOR_RECIPES = ("delayed", "tensorwise")

#: an NVIDIA architecture's first word (``DeviceSpec.arch``) -> CUDA compute capability (CUDA C++ Programming Guide,
#: "Compute Capabilities" table: Volta 7.0, Turing 7.5, Ampere GA100 8.0 / GA10x 8.6, Ada 8.9, Hopper 9.0); Blackwell
#: is split by its die code in :func:`compute_capability` (GB100/GB110: 10.0/10.3, data-centre; GB20x: 12.0; GB10,
#: DGX Spark: 12.1)
_ARCH_CC = {"volta": (7, 0), "turing": (7, 5), "ampere": (8, 6), "ada": (8, 9), "hopper": (9, 0)}


#: data-centre Blackwell's compute capabilities, [low, high): 10.x (GB100 10.0, GB110 10.3); Transformer Engine 2.20.2
#: tests this range for its non-TN FP8 GEMMs (``pytorch/utils.py`` l. 770-775) and MXFP8 (``pytorch/quantization.py``
#: l. 162-168: 10.0 or higher, refused from 12.0)
DATACENTRE_BLACKWELL_CC = ((10, 0), (12, 0))


def datacentre_blackwell(cc: tuple[int, int] | None) -> bool:
    """Whether compute capability ``cc`` (:func:`compute_capability`; None: unknown) is data-centre Blackwell's
    (:data:`DATACENTRE_BLACKWELL_CC`)."""
    low, high = DATACENTRE_BLACKWELL_CC
    return cc is not None and low <= cc < high


def compute_capability(spec) -> tuple[int, int] | None:
    """The CUDA compute capability Transformer Engine would see on ``spec`` (it reads
    ``torch.cuda.get_device_capability()``; wattcast has the spec's ``vendor``, ``arch`` and ``name`` only). None: not
    an NVIDIA GPU, or an architecture this rule does not know. The rule, on ``arch`` (``"Blackwell (GB100)"``) and then
    ``name``:

    - Volta 7.0, Turing 7.5, Ampere 8.0 for the GA100 die else 8.6, Ada 8.9, Hopper 9.0;
    - Blackwell by its die code: GB1xx (B200, GB200: GB100; B300, GB300: GB110) 10.x, data-centre; GB2xx (RTX 50,
      RTX PRO Blackwell) 12.0; GB10 (DGX Spark) 12.1. Without a die code, GDDR memory or a name with "RTX" or
      "GeForce" (and no HBM) is a consumer / workstation part (12.0, ``data.device_spec.blackwell_segment``),
      anything else is taken as data-centre Blackwell (10.0): every Blackwell a training cluster runs (B200, GB200,
      B300, GB300) is one.
    """
    if str(getattr(spec, "vendor", "nvidia") or "").lower() != "nvidia":
        return None
    arch = str(getattr(spec, "arch", "") or "").strip().lower()
    family = arch.split()[0] if arch else ""
    if family == "blackwell":
        die = re.search(r"\bgb(\d+x?)", arch)  # GB20x (the README's spelling): 12.0, not GB10's 12.1
        if die:
            digits = die.group(1)
            if len(digits) == 3:
                return (10, 3 if digits.startswith("11") else 0) if digits[0] == "1" else (12, 0)
            return (12, 1)  # GB10
        from wattcast.data.device_spec import blackwell_segment  # the spec checks' rule (GDDR / RTX name; HBM)

        return (12, 0) if blackwell_segment(spec) == "consumer" else (10, 0)
    if family == "ampere":
        return (8, 0) if "ga100" in arch else (8, 6)
    return _ARCH_CC.get(family)


def fp8_writes_transpose(spec) -> bool:
    """Whether Transformer Engine writes the transpose of a per-tensor-scaled FP8 tensor (delayed, tensorwise) on
    ``spec``: not where its FP8 GEMMs take non-TN layouts, ``is_non_tn_fp8_gemm_supported`` (TE 2.20.2
    ``pytorch/utils.py`` l. 770-775: compute capability 10.0 <= cc < 12.0, or cc >= 13.0: data-centre Blackwell),
    where the cast writes the data alone (``csrc/quantizer.cpp`` l. 361-375 and l. 678-690). A GPU of unknown
    capability (:func:`compute_capability` None) is given the transpose, as Hopper."""
    cc = compute_capability(spec)
    return not (datacentre_blackwell(cc) or (cc is not None and cc >= (13, 0)))


def unsupported_fp8_recipe(spec, recipe: str) -> str | None:
    """Why ``spec`` cannot run ``recipe`` (None when it can), after the FP8 check of
    ``data.device_spec.unsupported_step_dtype``. TE 2.20.2 ``pytorch/quantization.py``: MXFP8 needs compute capability
    10.0 or higher and is refused from 12.0 ("not supported on 12.0+ architectures yet", l. 162-168: data-centre
    Blackwell only, not GB20x), FP8 block scaling 9.0 or higher (l. 178-185: Hopper and every Blackwell, GB20x too;
    not Ada; its CUDA >= 12.9 condition is assumed met). Both are NVIDIA Transformer Engine recipes: an AMD GPU is
    refused for them. The compute capability is :func:`compute_capability`'s (from the spec's arch and name; until
    stop 44 GB20x was refused for blockwise)."""
    shown = recipe
    recipe = quantizer_of(recipe)
    if recipe not in ("mxfp8", "blockwise"):
        return None
    arch = str(getattr(spec, "arch", "") or "")
    vendor = str(getattr(spec, "vendor", "nvidia") or "").lower()
    name = getattr(spec, "name", "this GPU")
    cc = compute_capability(spec)
    mxfp8_ok = datacentre_blackwell(cc)
    block_ok = cc is not None and cc >= (9, 0)
    cc_txt = f"compute capability {cc[0]}.{cc[1]}" if cc else "compute capability unknown"
    if recipe == "mxfp8" and not mxfp8_ok:
        return (f"--fp8-recipe mxfp8 needs MXFP8 tensor cores (Transformer Engine: compute capability 10.x, data-centre "
                f"Blackwell: B200, GB200, B300), but {name} is {vendor or 'unknown vendor'} {arch or '(arch unknown)'} "
                f"({cc_txt}); use --fp8-recipe delayed or tensorwise" + (" (or blockwise)" if block_ok else ""))
    if recipe == "blockwise" and not block_ok:
        return (f"--fp8-recipe {shown} needs FP8 block-scaled GEMMs (Transformer Engine: compute capability 9.0 or "
                f"higher, Hopper or Blackwell, CUDA 12.9+), but {name} is {vendor or 'unknown vendor'} "
                f"{arch or '(arch unknown)'} ({cc_txt}); use --fp8-recipe delayed or tensorwise")
    return None
