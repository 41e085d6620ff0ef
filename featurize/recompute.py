"""Activation recomputation settings: ``none``, ``selective`` (Megatron-Core's ``--recompute-modules``) and ``full``.

A setting is one string, so every layer that carries ``recompute`` carries the modules with it: ``"none"``,
``"full"``, ``"selective"`` (the attention core, Korthikanti et al. 2022 Sec. 5 and Megatron-Core's default module
list) or ``"selective:<module>,<module>..."`` for Megatron-Core's ``--recompute-granularity selective
--recompute-modules ...`` (TransformerConfig.recompute_modules, Megatron-Core 0.12+):

- ``core_attn``: the attention core (the ops tagged ``attn_core``), checkpointed: its inputs kept, what it makes re-made;
- ``mlp``: a dense MLP block, checkpointed;
- ``moe``: a mixture-of-experts block (router, dispatch, experts, combine), checkpointed;
- ``shared_experts``: a MoE block's shared experts, checkpointed;
- ``moe_act``, ``layernorm``, ``mla_up_proj``: Megatron-Core runs these with ``CheckpointWithoutOutput``: their
  output is discarded as well once its consumer has run, and re-made before the consumer's backward -- the MoE experts'
  activation function, the input and pre-MLP norms, multi-head latent attention's query/key/value up-projections with
  their norms and rotary embedding. An FP8 GEMM's own FP8 copy of such an output stays (Transformer Engine keeps it).

The graph builders tag each op with the modules it belongs to (a comma-separated ``tag``); memory
(``simulate/memory.py``) drops what the modules' rules drop and the training graph re-runs their ops in backward.
"""

from __future__ import annotations

RECOMPUTE = ("none", "selective", "full")
#: Megatron-Core's recompute module names -> the graph tag on their ops
MODULE_TAGS = {"core_attn": "attn_core", "mlp": "mlp", "moe": "moe", "shared_experts": "shared_experts",
               "moe_act": "moe_act", "layernorm": "layernorm", "mla_up_proj": "mla_up_proj"}
#: modules whose outputs are discarded too (Megatron-Core's CheckpointWithoutOutput)
OUTPUT_DISCARDING = ("moe_act", "layernorm", "mla_up_proj")
#: ``selective`` alone: Megatron-Core's default module list
DEFAULT_MODULES = ("core_attn",)


class RecomputeError(ValueError):
    """A recompute setting that is not one wattcast models."""


def parse_recompute(value) -> tuple[str, tuple[str, ...]]:
    """(mode, modules) of a setting: modules in :data:`MODULE_TAGS` order, empty unless the mode is selective."""
    text = str(value).strip().lower()
    mode, sep, mods = text.partition(":")
    if mode not in RECOMPUTE:
        raise RecomputeError(f"unknown recompute {value!r}; use none, selective, full or selective:<modules>")
    if mode != "selective":
        if sep:
            raise RecomputeError(f"{value!r}: recompute modules need selective recomputation, not {mode!r} "
                                 "(Megatron-Core: --recompute-modules with --recompute-granularity selective)")
        return mode, ()
    if sep and not mods.strip(", "):
        raise RecomputeError(f"recompute {value!r} names no module; name at least one of " + ", ".join(MODULE_TAGS))
    names = [m.strip() for m in mods.split(",") if m.strip()] if sep else list(DEFAULT_MODULES)
    unknown = [m for m in names if m not in MODULE_TAGS]
    if unknown:
        raise RecomputeError(f"unknown recompute module(s) {unknown}; Megatron-Core's are {', '.join(MODULE_TAGS)}")
    return mode, tuple(m for m in MODULE_TAGS if m in names)


def recompute_setting(mode="none", modules=None) -> str:
    """The canonical string of a mode and a module list (a sequence or a comma-separated string; given, it implies
    selective recomputation, as ``--recompute-modules`` does, and is an error with ``full``): ``"selective"`` for the
    default list, so settings without modules read as before."""
    base, names = parse_recompute(mode)
    if modules is not None:
        if isinstance(modules, str):
            mods = modules
        elif isinstance(modules, (list, tuple)) and all(isinstance(m, str) for m in modules):
            mods = ",".join(modules)
        else:
            raise RecomputeError(f"recompute modules must be names (a list, or one comma-separated string), got {modules!r}")
        if not mods.strip(", "):
            raise RecomputeError("the recompute module list is empty; name at least one of " + ", ".join(MODULE_TAGS))
        if ":" in str(mode):
            raise RecomputeError(f"modules given twice: in the recompute setting {mode!r} and as {mods!r}")
        if base == "full":
            raise RecomputeError("recompute modules select what selective recomputation re-runs; with full "
                                 "recomputation every layer is re-run (drop one of the two)")
        base, names = parse_recompute(f"selective:{mods}")
    if base != "selective" or names == DEFAULT_MODULES:
        return base
    return f"{base}:{','.join(names)}"


def recompute_tags(value) -> tuple[set[str], set[str]]:
    """(tags of checkpointed modules, tags of output-discarding modules) a setting recomputes (empty sets unless
    selective)."""
    mode, mods = parse_recompute(value)
    keep = {MODULE_TAGS[m] for m in mods if m not in OUTPUT_DISCARDING}
    discard = {MODULE_TAGS[m] for m in mods if m in OUTPUT_DISCARDING}
    return keep, discard


#: the tag of the MoE SwiGLUs DeepSeek-V3's storage re-runs in the backward from their FP8-cached input (tech report
#: arXiv 2412.19437 Sec. 3.3.3 (2); ``--fp8-recipe deepseek``: featurize/op_graph.py ``GraphBuilder.glu``)
FP8_SWIGLU_TAG = "fp8_swiglu"


def deepseek_storage(meta: dict) -> bool:
    """Whether a graph was built under DeepSeek-V3's low-precision storage (``--fp8-recipe deepseek``)."""
    return meta.get("fp8_scaling") == "deepseek"


def storage_rerun_tags(meta: dict, recompute: str = "none") -> set[str]:
    """Tags of ops the backward re-runs because of how activations are stored, under the recompute setting
    ``recompute``: DeepSeek-V3's MoE SwiGLU (:data:`FP8_SWIGLU_TAG`) under its storage; none otherwise, and none under
    full recomputation (the whole layer re-runs anyway)."""
    return {FP8_SWIGLU_TAG} if deepseek_storage(meta) and recompute != "full" else set()


def module_layers_end(meta: dict) -> int:
    """The layers (0 .. end - 1) whose ops selective recomputation's module tags apply to: the transformer layers,
    and the head's layer too when it holds multi-token prediction's block (a transformer layer of the same config;
    the head's own ops carry no module tags). Full recomputation re-runs the transformer layers only."""
    n_layers = int(meta.get("n_layers", 0) or 0) or 1 << 30
    return n_layers + 1 if meta.get("mtp_embedding_params") else n_layers


def node_tags(tag) -> frozenset:
    """The tags of one op (its ``tag`` column: comma-separated, empty for none)."""
    return frozenset(t for t in str(tag).split(",") if t) if tag else frozenset()
