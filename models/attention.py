"""Fused (flash) attention kernels: a spec-sheet model, not a GEMM surrogate.

A fused attention kernel never writes the S x S scores to memory: it streams key/value tiles through shared
memory and keeps a running softmax in registers. Costing it as two batched GEMMs (QK^T and PV, what wattcast did
before) charges the S x S output to HBM, so the prediction turned memory-bound, depended on the memory bandwidth
(an A100 40 GB came out 30% slower than an 80 GB at sequence 32k) and was far off on long sequences. Here:

    time = max(tensor-core time + softmax time, memory time), then wave quantization

- **tensor-core time**: the executed matrix FLOPs (4 x B x H x S_q x S_kv x d forward, 2.5x that backward;
  a causal kernel skips the blocks above the diagonal but computes the diagonal ones whole, so it executes
  (n + 1) / (2n) of the full square with n = S / 128 key blocks) at ``mma_efficiency`` of the dense peak, scaled
  by the device's achievable-matmul ceiling over the reference A100's (``mma_scale``, below);
- **softmax time**: the score elements' non-matrix work (scale, running max, exp, row sums, conversion forward;
  recomputing P and dS = P * (dP - D) backward) at the device's scalar FP32 rate (one FMA per lane per clock,
  :func:`scalar_fp32_tflops`): ``SOFTMAX_FP32_OPS`` operations per element. This is what makes head dimension 64
  slower than 128 (half the matrix work per score element) and it scales with the spec sheet's FP32/tensor ratio;
- **memory time**: Q, K, V, O (and dO, dQ, dK, dV backward) once through HBM;
- **waves**: the kernel runs one thread block per (batch, head, 128-row query block) forward and per key block
  backward; blocks / (waves x SMs) of the machine does useful work.

Two implementation classes, each pinned to the paper's own figures on its native GPU (A100, head dim 128,
long sequences; FlashAttention-2, Dao 2023, arXiv:2307.08691, abstract and section 4.1):

- ``fa2``: FlashAttention-2 (PyTorch SDPA's built-in flash backend, the flash-attn 2.x package), forward up to 73%
  and backward up to 63% of the dense peak on a GPU whose tensor cores it drives with their own instruction (Ampere
  sm80, Ada sm89, consumer Blackwell sm120: warp-level ``mma.sync``). On Hopper (sm90) and data-centre Blackwell
  (sm100, sm103) FA2 still issues Ampere's ``mma.sync``, not the generation's ``wgmma`` / TMA (Hopper) or ``tcgen05``
  (Blackwell): see *off-native FA2* below;
- ``fa3``: the generation's own fused kernel: FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608; ``wgmma`` + TMA,
  sm90 only) and cuDNN's fused attention (what Transformer Engine runs on compute capability >= 9.0,
  ``featurize/te_attention.py``), reaching a similar share of its generation's peak as FA2 did of the A100's (the
  FA3 abstract: "up to 740 TFLOPs/s (75% utilization)" on H100 in FP16): the ``fa2`` shares, costed everywhere as
  ``fa2`` on its native GPUs (before stop 58 every ``fa2`` node was costed so). On a GPU where FA2 is native (Ampere,
  Ada) it is the same class and the same figures;
- ``fa1``: FlashAttention-1 and the Triton FlashAttention kernels of 2022-2023 (MosaicML's ``attn_impl: triton``):
  "25-40% of the theoretical maximum FLOPs/s" (the FlashAttention-2 abstract on FlashAttention-1); forward 40%,
  backward 30%.

``mma_efficiency`` per class is solved so that a head-dimension-128, long-sequence kernel on an A100 (312 dense
FP16 TFLOP/s, 19.5 FP32 TFLOP/s) reaches exactly the paper's share once its softmax time is added; nothing is
fitted to wattcast's validation data.

Other devices (``mma_scale``): the attention kernel's inner loops are GEMM tiles, so the share of the dense peak its
matrix part reaches is bounded by what the device's own best GEMMs reach. ``mma_efficiency`` is the A100's
(forward 0.846, backward 0.696: 97% and 80% of the A100's achievable-matmul ceiling, MAMF's 271 of 312 TFLOP/s) and
a device takes ``mma_efficiency x ceiling_device / ceiling_A100``, the ceilings being those the GEMM family's ceiling
member uses (``models/kernel_predictor.attention_mma_scale``: the MAMF table's best achievable matmul over the peak
where it lists the device, else the vendor's median). Until stop 40 every device took the A100's share of its own
peak, so an MI300X (MAMF ceiling 51% of peak) ran fused attention at 74% / 63% of peak, faster per FLOP than its own
largest GEMMs (971 / 819 TFLOP/s forward / backward against 601-622 for the same step's linear layers).

**Off-native FA2** (issue 14, audit 58e finding 2; until stop 58 ``fa2`` ran at the ``fa3`` figures on Hopper and
Blackwell: Llama 3 8B at 8k on H100, 693 / 596 TFLOP/s forward / backward). PyTorch's SDPA, what ``--framework hf``
and HF Trainer run, dispatches to its built-in FlashAttention-2 there: torch 2.13 ``torch._C._get_sdp_priority_order()``
is [FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH, CUDNN_ATTENTION, OVERRIDEABLE] and
``torch.nn.attention.current_flash_attention_impl()`` None (FA3 / FA4 are opt-in, registered from an external
``flash_attn_interface`` package: ``torch/nn/attention/_fa3.py`` ``register_flash_attention_fa3``). The FA3 paper's
abstract: "FlashAttention-2 ... achieving only 35% utilization on the H100 GPU". So on compute capability 9.0 <=
cc < 12.0 an ``fa2`` node takes ``OFF_NATIVE_FA2``'s shares, solved as above but on the H100 SXM5 (989.4 dense BF16,
66.9 FP32 TFLOP/s, the catalog's): forward 35% (the abstract's figure), backward 35% x 63/73 = 30.2% (ASSUMPTION: the
paper's abstract gives one figure; FA2's own A100 backward-to-forward ratio is carried over). A device other than the
H100 SXM scales that efficiency by its matmul ceiling over the H100 SXM's (as ``mma_scale`` does over the A100's).
Data-centre Blackwell (sm100): no published FA2-on-B200 figure is cited here; ASSUMPTION: the same instruction-class
argument, FA2's legacy ``mma.sync`` reaching the same share of the generation's dense peak as on Hopper. If the legacy
instruction's rate did not grow with ``tcgen05`` this is an upper bound (FA2 slower still). AMD (ROCm FA2: CK /
Triton kernels written for the CDNA matrix cores) is unchanged. ``fa1`` (FlashAttention-1's CUDA kernels are
``mma.sync`` too) takes its A100 shares times FA2's off-native / native ratio there (``OFF_NATIVE_FA1``, an ASSUMPTION:
no FA1-on-H100 figure is cited), so the older class stays the slower one on every GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wattcast.data.kernel_ops import FLASH_KERNELS as FLASH_KERNEL_NAMES

#: query / key block rows of a FlashAttention-2 thread block (128 x 64 or 128 x 128 tiles for d <= 128)
BLOCK_ROWS = 128
#: non-matrix FP32 operations per score element: forward (scale + running max + exp + sum + convert) and
#: backward (recompute exp, dP - D, multiply, scale, convert twice)
SOFTMAX_FP32_OPS = {"forward": 6.0, "backward": 12.0}
#: backward executes 2.5x the forward matrix FLOPs (five GEMMs against two, FlashAttention-2 section 3.2)
BACKWARD_FLOP_RATIO = 2.5

#: the A100 reference the paper's shares were measured on (NVIDIA A100 datasheet: 312 dense FP16/BF16 TFLOP/s,
#: 19.5 FP32 TFLOP/s)
_REF_PEAK_TFLOPS, _REF_FP32_TFLOPS, _REF_HEAD_DIM = 312.0, 19.5, 128
#: the catalog device of that reference (FlashAttention-2 section 4.1: "an A100 80GB SXM4 GPU"): its matmul ceiling
#: is the one ``mma_scale`` divides by
REFERENCE_DEVICE = "A100-SXM4-80GB"


def scalar_fp32_tflops(peak_fp32_tflops: float, num_sms: float, cores_per_sm: float | None,
                       boost_clock_mhz: float) -> float:
    """The FP32 rate of one FMA per lane per clock (TFLOP/s): the spec sheet's FP32 peak divided by how many times
    the lanes' single-issue rate (SMs x lanes x 2 x clock) it counts.

    CDNA3/4 datasheets count packed FP32 (two FP32 operations per lane per clock with ``v_pk_fma_f32``): MI300X's
    163.4 TFLOP/s is 304 CUs x 256 FLOP/clock x 2.1 GHz (AMD CDNA 3 white paper, peak FLOPs/clock/CU: FP32 vector
    256), twice its 64 lanes' single-issue 81.7. Softmax's max and exp have no packed form (CDNA3 ISA reference, VOP3P
    opcodes: packed FP32 only for FMA, MUL, ADD and MOV), and the A100 the op count is calibrated on issues one FP32
    operation per lane per clock (19.5 = 108 x 64 x 2 x 1.41 GHz), so the softmax work runs at this rate. Every
    NVIDIA catalog peak and the CDNA1/2 vector peaks are already single-issue (ratio 1; B200's 75 against 74.4 from
    its boost clock rounds to 1). Without ``cores_per_sm`` the peak as given."""
    if not cores_per_sm or not num_sms or not boost_clock_mhz:
        return float(peak_fp32_tflops)
    lanes_tflops = float(num_sms) * float(cores_per_sm) * 2.0 * float(boost_clock_mhz) / 1e6
    return float(peak_fp32_tflops) / max(round(float(peak_fp32_tflops) / lanes_tflops), 1)


#: the device the off-native FA2 share was measured on (FlashAttention-3 paper, arXiv:2407.08608, section 4: H100 SXM5)
#: and its catalog peaks (dense BF16, FP32): the off-native efficiency is solved on it and scaled by a device's matmul
#: ceiling over its
OFF_NATIVE_REFERENCE_DEVICE = "H100-SXM5-80GB"
_OFF_NATIVE_PEAK_TFLOPS, _OFF_NATIVE_FP32_TFLOPS = 989.4, 66.908
#: compute capabilities [from, to) whose tensor cores FA2's ``mma.sync`` does not drive with their own instruction:
#: Hopper sm90 (wgmma / TMA) and data-centre Blackwell sm100 / sm103 (tcgen05); sm120 / sm121 (RTX / RTX PRO
#: Blackwell, DGX Spark) are warp-level mma like Ampere and Ada
OFF_NATIVE_CC = ((9, 0), (12, 0))


def _solved_efficiency(share: float, phase: str, peak_tflops: float, fp32_tflops: float) -> float:
    """Tensor-core efficiency that, with the reference's softmax time added, gives ``share`` of ``peak_tflops`` on a
    head-dimension-128, long-sequence kernel (module docstring)."""
    flops_per_elem = 4.0 * _REF_HEAD_DIM * (BACKWARD_FLOP_RATIO if phase == "backward" else 1.0)
    total = flops_per_elem / (peak_tflops * share)
    softmax = SOFTMAX_FP32_OPS[phase] / fp32_tflops
    return flops_per_elem / (peak_tflops * (total - softmax))


@dataclass(frozen=True)
class FlashKernel:
    """One implementation class: the share of the dense peak it reaches (head dim 128, long sequence, A100), and,
    for a kernel that does not use Hopper's / data-centre Blackwell's own tensor-core instruction, the share it reaches
    there (``off_native_shares``: forward, backward on the H100 SXM5; None: native everywhere)."""

    name: str
    forward_share: float
    backward_share: float
    source: str
    off_native_shares: tuple[float, float] | None = None

    def mma_efficiency(self, phase: str, off_native: bool = False) -> float:
        """Tensor-core efficiency that, with the reference softmax time added, gives the published share (the A100's;
        ``off_native``: the H100 SXM5's off-native share, for a device in :data:`OFF_NATIVE_CC`)."""
        if off_native and self.off_native_shares is not None:
            share = self.off_native_shares[0 if phase == "forward" else 1]
            return _solved_efficiency(share, phase, _OFF_NATIVE_PEAK_TFLOPS, _OFF_NATIVE_FP32_TFLOPS)
        share = self.forward_share if phase == "forward" else self.backward_share
        return _solved_efficiency(share, phase, _REF_PEAK_TFLOPS, _REF_FP32_TFLOPS)


#: FA2 on H100: forward 35% (FlashAttention-3 abstract, arXiv:2407.08608: "FlashAttention-2 ... achieving only 35%
#: utilization on the H100 GPU"); backward 35% x 63/73 (ASSUMPTION: FA2's own A100 backward/forward ratio)
OFF_NATIVE_FA2 = (0.35, 0.35 * 0.63 / 0.73)
#: FA1 on H100: its A100 shares times FA2's off-native / native ratio (0.35 / 0.73 = 0.479). ASSUMPTION: no cited FA1
#: figure on H100; the same Ampere-instruction penalty as FA2's (keeps the older class the slower one there)
OFF_NATIVE_FA1 = (0.40 * 0.35 / 0.73, 0.30 * 0.35 / 0.73)

FLASH_KERNELS = {
    "fa2": FlashKernel("fa2", 0.73, 0.63, "FlashAttention-2 (Dao 2023, arXiv:2307.08691): forward up to 73%, backward "
                                         "up to 63% of A100's peak; 35% of H100's (FlashAttention-3 abstract)",
                       off_native_shares=OFF_NATIVE_FA2),
    "fa1": FlashKernel("fa1", 0.40, 0.30, "FlashAttention-1 / Triton FlashAttention: 25-40% of A100's peak "
                                         "(FlashAttention-2 abstract)", off_native_shares=OFF_NATIVE_FA1),
    "fa3": FlashKernel("fa3", 0.73, 0.63, "FlashAttention-3 / cuDNN fused attention, the generation's own kernel: "
                                         "FA2's A100 shares on its native GPU (FA3: 75% of H100's peak)"),
}
DEFAULT_FLASH_KERNEL = "fa2"


def off_native(kernel: str, compute_capability: tuple[int, int] | None) -> bool:
    """Whether ``kernel`` runs off its native tensor-core instruction on a GPU of ``compute_capability`` (None: not an
    NVIDIA GPU wattcast knows the capability of; native)."""
    k = FLASH_KERNELS[kernel]
    return (k.off_native_shares is not None and compute_capability is not None
            and OFF_NATIVE_CC[0] <= tuple(compute_capability) < OFF_NATIVE_CC[1])
if tuple(FLASH_KERNELS) != FLASH_KERNEL_NAMES:  # pragma: no cover - a packaging mistake
    raise RuntimeError("data/kernel_ops.FLASH_KERNELS and models/attention.FLASH_KERNELS must list the same kernels")


def flash_attention_ms(*, kernel: np.ndarray, phase: np.ndarray, bh: np.ndarray, s_q: np.ndarray, s_kv: np.ndarray,
                       head_dim: np.ndarray, kept: np.ndarray, io_bytes: np.ndarray, peak_tflops: np.ndarray,
                       fp32_tflops: float, memory_gbps: float, sms: int, mma_scale=1.0,
                       compute_capability: tuple[int, int] | None = None, off_native_mma_scale=1.0) -> np.ndarray:
    """GPU time (ms) of fused attention kernels, one per row (vectorised).

    ``bh``: batch x heads; ``s_q``/``s_kv``: query / key lengths; ``kept``: the share of the S_q x S_kv scores the
    mask keeps (0.5 causal, 1 none; a causal square also computes its diagonal blocks whole);
    ``io_bytes``: the bytes the kernel moves through HBM; ``peak_tflops``: the dense tensor-core peak of each
    row's dtype; ``phase``: "forward" or "backward"; ``kernel``: a :data:`FLASH_KERNELS` key; ``fp32_tflops``: the
    rate the softmax work runs at (:func:`scalar_fp32_tflops`); ``mma_scale`` (scalar or per row): the device's
    achievable-matmul ceiling in the row's dtype over the reference A100's (1 on the A100); ``compute_capability``:
    the device's (None: not NVIDIA), which decides whether an ``fa2`` row runs off-native (:func:`off_native`); its
    efficiency is then the H100's off-native one times ``off_native_mma_scale`` (scalar or per row: the device's
    ceiling over the H100 SXM5's) in place of ``mma_scale``."""
    kernel = np.asarray(kernel, dtype=object)
    unknown = sorted(set(kernel) - set(FLASH_KERNELS))
    if unknown:
        raise ValueError(f"unknown flash attention kernel(s) {unknown}; expected one of {sorted(FLASH_KERNELS)}")
    bwd = np.asarray(phase) == "backward"
    bh, s_q, s_kv, d = (np.asarray(a, dtype=float) for a in (bh, s_q, s_kv, head_dim))
    n_kv = np.maximum(np.ceil(s_kv / BLOCK_ROWS), 1.0)
    kept = np.clip(np.asarray(kept, dtype=float), 0.0, 1.0)
    exec_frac = np.where((kept < 1.0) & (s_q == s_kv), np.minimum(kept * (n_kv + 1.0) / n_kv, 1.0), kept)
    elems = bh * s_q * s_kv * exec_frac
    mma_flops = 4.0 * elems * d * np.where(bwd, BACKWARD_FLOP_RATIO, 1.0)
    # one efficiency per (kernel class, phase), not per row
    pairs, inv = np.unique(np.stack([kernel.astype(str), np.where(bwd, "backward", "forward")]), axis=1,
                           return_inverse=True)
    offn = np.array([off_native(k, compute_capability) for k in pairs[0]], dtype=bool)
    eff = np.array([FLASH_KERNELS[k].mma_efficiency(ph, o) for (k, ph), o in zip(pairs.T, offn)],
                   dtype=float)[inv.ravel()]
    # the A100's share, scaled by the device's achievable-matmul ceiling over the A100's (module docstring); an
    # off-native row: the H100's share, scaled by the device's ceiling over the H100 SXM5's
    eff = eff * np.where(offn[inv.ravel()], np.asarray(off_native_mma_scale, dtype=float),
                         np.asarray(mma_scale, dtype=float))
    mma_s = mma_flops / (np.asarray(peak_tflops, dtype=float) * 1e12 * eff)
    softmax_s = elems * np.where(bwd, SOFTMAX_FP32_OPS["backward"], SOFTMAX_FP32_OPS["forward"]) / (fp32_tflops * 1e12)
    mem_s = np.asarray(io_bytes, dtype=float) / (memory_gbps * 1e9)
    # one thread block per (batch, head, 128-row block); the last wave may leave SMs idle
    blocks = bh * np.ceil(np.where(bwd, s_kv, s_q) / BLOCK_ROWS)
    waves = np.ceil(blocks / max(int(sms), 1))
    fill = blocks / np.maximum(waves * max(int(sms), 1), 1.0)
    return np.maximum((mma_s + softmax_s) / np.maximum(fill, 1e-9), mem_s) * 1e3
