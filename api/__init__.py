"""wattcast: forecast deep-learning step time, power, energy, cost and CO2e on hardware you do not have."""

from __future__ import annotations

import os

# Never phone home from library code paths (MLflow, Hugging Face).
# OMP_WAIT_POLICY=PASSIVE: LightGBM's and torch's OpenMP runtimes (and other processes) otherwise spin
# against each other on a 2-core machine; measured here as a >20x slowdown of training.
for _k, _v in (
    ("MLFLOW_DISABLE_TELEMETRY", "true"),
    ("DO_NOT_TRACK", "true"),
    ("HF_HUB_OFFLINE", "1"),
    ("OMP_WAIT_POLICY", "PASSIVE"),
):
    os.environ.setdefault(_k, _v)

__version__ = "0.1.0"

from wattcast.simulate.defaults import DEFAULTS  # noqa: E402  (after the environment above)
from wattcast.data.checks import allow_exotic  # noqa: E402  (``with wattcast.allow_exotic():`` = the CLI's --force)
from wattcast.request import ParallelOptions, PredictRequest, RunOptions  # noqa: E402  (one request: the CLI's too)


def _model_folder_options(fn):
    """``fn`` taking the keywords ``models=``, ``collectives=`` and ``power_model=``: the folders of a retrained kernel
    bundle, collective model and power model (what ``wattcast train kernels|collectives|power --out FOLDER`` wrote),
    each defaulting to ``$WATTCAST_MODELS`` / ``$WATTCAST_COLLECTIVES`` / ``$WATTCAST_POWER_MODEL``, then the shipped
    model. They are checked first (``wattcast.models.selection.ModelFolderError``, a ValueError naming the folder and
    what is missing) and ``fn`` runs with them (``models/selection.py``)."""
    import functools
    import inspect

    @functools.wraps(fn)
    def run(*args, models=None, collectives=None, power_model=None, **kw):
        from wattcast.models.selection import resolve_folders, using_folders

        with using_folders(resolve_folders(models, collectives, power_model)):
            return fn(*args, **kw)

    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    extra = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None)
             for k in ("models", "collectives", "power_model")]
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    run.__signature__ = sig.replace(parameters=params[:at] + extra + params[at:])
    return run


def predict_kernels(frame, device, *, dtype: str | None = None, models=None):
    """Predict per-kernel latency for every row of ``frame`` on ``device`` (see wattcast.models.kernel_predictor).

    As ``wattcast kernels``: ``dtype`` is the dtype of rows that give none (no ``dtype`` column, or an empty cell;
    default fp32), and a row whose own dtype differs is a ValueError (the frame's dtype is never overridden);
    ``models`` is a retrained kernel bundle's folder (``wattcast train kernels --out``; default
    ``$WATTCAST_MODELS``, then the shipped model), checked first (``ModelFolderError``, a ValueError). The spec's
    warnings (a tensor peak that looks sparse on an unknown architecture, no ``tdp_w``: ``spec_notes``) are in the
    result's ``attrs["warnings"]``."""
    from wattcast.models.kernel_predictor import _resolve, check_kernel_frame, frame_with_default_dtype
    from wattcast.models.kernel_predictor import predict_kernels as _pk
    from wattcast.models.selection import resolve_folders

    bundle = resolve_folders(models, kinds=("models",)).models  # as predict(models=) checks it
    if dtype is not None:
        check_kernel_frame(frame)
    device = _resolve(device)
    if dtype is not None:
        frame = frame_with_default_dtype(frame, dtype, device, "the frame", "dtype=")
    from wattcast.data.device_spec import spec_notes

    out = _pk(frame, device, bundle=bundle)
    out.attrs["warnings"] = spec_notes(device, power=False)  # as `wattcast kernels` prints them (no tdp_w, ...)
    return out


@_model_folder_options
def predict(model, device, *, batch: int | None = None, seq: int | None = None, mode: str = "train",
            dtype: str = DEFAULTS.dtype, attention: str = DEFAULTS.attention, compile: bool = False,
            optimizer: str = DEFAULTS.optimizer, recompute: str = "none", recompute_modules=None,
            optimizer_impl: str | None = None, grad_accumulation: bool = False, bundle=None, power_limit_w: float | None = None,
            clock_cap_mhz: float | None = None, dims: dict[str, int] | None = None, example_inputs=None,
            tokens: float | None = None, loop_trip_count: int | dict[str, int] | None = None,
            data_load_ms: float = 0.0, data_workers: int | None = None, kv_context: int | None = None,
            logits: str | None = None, serving: str | None = None, prompt_tokens: int | None = None,
            output_tokens: int | None = None, fp8_recipe: str | None = None, host_us: float | None = None,
            cudnn_tf32: bool = True, **run_kw):
    """Predict one training step (or inference pass) of ``model`` on ``device``.

    ``model``: an ONNX file, a Hugging Face ``config.json`` or model folder, a Hub id (``org/name``) whose config is
    in the local Hugging Face cache, a built-in name (``wattcast.builtin_models()``), a config dict, or a
    ``torch.nn.Module``. ``device``: a catalog name, a spec file or a DeviceSpec.
    ``batch`` / ``seq`` default to 1 and 1,024; an ONNX file with fixed input dims keeps its own, and giving
    values it cannot take raises ``GraphError``. ``dims`` binds other symbolic ONNX input dims by name.
    ``example_inputs``: the forward inputs of a ``torch.nn.Module`` (tensors on any device, meta included; only shapes
    and dtypes are used), instead of ``batch``/``seq``; without them a module gets (batch, seq) token ids only when its
    first layer with parameters is an ``nn.Embedding`` / ``nn.EmbeddingBag``, any other module is a ``GraphError``.
    ``loop_trip_count``: iterations of an ONNX model's Loops whose trip count is known only at run time (a count, or
    ``{node name: count}``); see ``wattcast.featurize.onnx``.
    ``recompute_modules``: Megatron-Core's selective recomputation modules (a list or a comma-separated string of
    core_attn, mlp, moe, shared_experts, moe_act, layernorm, mla_up_proj; ``wattcast.featurize.recompute``); given,
    they imply ``recompute="selective"`` (an error with ``"full"``).
    ``data_load_ms`` / ``data_workers``: the data loader's host ms per step and its worker processes (default 0 ms and 0
    workers, the HF Trainer's: the load in series with the step); the batch's copy to the GPU is in the step too
    (``simulate/data_loading.py``; ``meta["data_loading"]``, ``overheads["data_loading_ms"]``).
    ``kv_context`` (``mode="inference"``, Llama-architecture configs): tokens already in each sequence's KV cache; the
    step runs ``seq`` new tokens per sequence against context + seq cached keys/values (``seq=1``: one decode step;
    ``kv_context=0``: a prefill that fills the cache), and the memory holds the cache (``memory["kv_cache_gb"]``).
    ``logits``: "last" (inference's default: the last position's, as generation computes them) or "all".
    ``fp8_recipe`` (with ``dtype="fp8"``): Megatron-Core's ``--fp8-recipe``, "delayed" (None: the default),
    "tensorwise", "mxfp8" (data-centre Blackwell) or "blockwise" (Hopper, Blackwell); featurize/fp8_recipes.py.
    Inference results carry ``tokens_per_s`` (batch x seq / step time) and ``ms_per_token`` (step time / seq).
    ``cudnn_tf32`` (``torch.backends.cudnn.allow_tf32``, default True as in PyTorch): an fp32 model's convolutions run in
    TF32 on a GPU with TF32 tensor cores (``simulate.single_device.with_cudnn_tf32``); False keeps them FP32. The
    result's ``to_dict()["conv_math"]`` counts the convolution kernels costed each way.
    ``host_us``: the host's time per kernel launch (us, finite, >= 0; None: 40 us, eager PyTorch's on the profiled
    hosts, which measured 35-170 us), composed as an in-order launch queue (``simulate.single_device.cost_nodes``);
    a ``compile=True`` step's default is the bare CUDA launch cost (6 us); refused with ``serving`` (a served step
    takes max(GPU, 6 us) per kernel). ``settings["host_us"]`` is the value the step was costed with, given or not.
    ``serving`` ("vllm"; default None: off, the bare GPU step), with ``kv_context``, ``seq=1``, ``prompt_tokens`` and
    ``output_tokens`` (the requests' mean prompt and output lengths): the decode step as one iteration of a
    continuously-batched serving engine, its fitted host time per iteration (a + b x batch, in series with the GPU
    step) and each request's prefill amortised over its output tokens added (``simulate/serving.py``;
    ``overheads["serving_host_ms"]`` / ``["serving_prefill_ms"]``, ``meta["serving"]``, ``to_dict()["serving"]``).
    Returns a :class:`wattcast.simulate.single_device.StepPrediction` (``forward_ms``, ``backward_ms``,
    ``optimizer_ms``, ``step_time_ms``, ``memory_gb``, ``flops``, ``per_op``, ``fallback_ops``,
    ``ood_fraction``, ...). Graphs and distinct-kernel predictions are cached, so repeated calls are cheap.
    ``tokens``: a training run's length in tokens; the result's ``run`` then holds the whole run's hours, energy,
    TCO and CO2e (``run_kw``: region, pue, lifetime_years, grid_kgco2e_per_kwh, ... as ``wattcast predict --tokens``).
    ``models`` / ``collectives`` / ``power_model``: folders of retrained models (what ``wattcast train kernels|
    collectives|power --out FOLDER`` writes: a versioned folder or a flat one); default ``$WATTCAST_MODELS`` /
    ``$WATTCAST_COLLECTIVES`` / ``$WATTCAST_POWER_MODEL``, else the shipped models. A folder without such a model is a
    ValueError (``wattcast.models.selection.ModelFolderError``) naming it and what is missing. ``bundle``: a loaded
    ``KernelBundle`` object, used as given.
    """
    from wattcast.data.catalog import resolve_device
    from wattcast.data.device_spec import DeviceSpec
    from wattcast.featurize.recompute import recompute_setting
    from wattcast.featurize.fp8_recipes import fp8_writes_transpose
    from wattcast.featurize.te_attention import te_attention_backend, vllm_flash_kernel
    from wattcast.featurize.workload import StepOptions, step_graph
    from wattcast.simulate.single_device import predict_graph

    from wattcast.request import check_inference_options

    # the CLI's check (training-only options in an inference step); the default optimizer is "not given"
    check_inference_options(mode, optimizer=optimizer, recompute=recompute, optimizer_impl=optimizer_impl,
                            recompute_modules=recompute_modules, grad_accumulation=grad_accumulation,
                            default_optimizer=DEFAULTS.optimizer)
    from wattcast.simulate.defaults import shown_dtype, step_dtype

    from wattcast.simulate.serving import check_serving

    engine = check_serving(serving, kv_context=kv_context, seq=seq, mode=mode, prompt_tokens=prompt_tokens,
                           output_tokens=output_tokens)
    if engine is not None and seq is None:
        seq = 1  # a decode iteration: one new token per running sequence (not the default 1,024-token step)
    spec = device if isinstance(device, DeviceSpec) else resolve_device(device)
    opts = StepOptions(batch=batch, seq=seq, mode=mode, dtype=step_dtype(dtype, spec), attention=attention, compile=compile,
                       optimizer=optimizer, optimizer_impl=optimizer_impl,
                       recompute=recompute_setting(recompute, recompute_modules), grad_accumulation=grad_accumulation,
                       dims=dims or (), loop_trip_count=loop_trip_count, kv_context=kv_context, logits=logits,
                       fp8_recipe=fp8_recipe, fp8_transpose=fp8_writes_transpose(spec),
                       te_attention_backend=te_attention_backend(spec),
                       # served by vLLM: its attention kernel class (FA3 on Hopper), else SDPA's FlashAttention-2
                       **({"flash_kernel": vllm_flash_kernel(spec)} if engine is not None else {}),
                       fused_moe=engine is not None,  # served by vLLM: its fused MoE kernels, else transformers' loop
                       cudnn_tf32=cudnn_tf32)  # torch.backends.cudnn.allow_tf32: fp32 convs in TF32 (to_dict's conv_math)
    from wattcast.simulate.single_device import step_host_cost

    launch_ms, host_model = step_host_cost(compile=bool(compile), served=engine is not None, host_us=host_us)
    graph = step_graph(model, opts, example_inputs=example_inputs)
    _attention_settings(graph.meta, attention)  # an attention the imported graph was not costed with: refused
    res = predict_graph(graph, spec, bundle, power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz,
                        launch_overhead_ms=launch_ms, host_model=host_model)
    from wattcast.models.power import idle_power_w
    from wattcast.simulate.data_loading import one_device

    res = one_device(res, load_ms=data_load_ms, workers=data_workers, idle_power_w=idle_power_w(spec))
    if graph.meta.get("precision") == "fp8" and engine is None:
        # the same step in bf16 (its graph and costing: a second prediction, measured 0.12 -> 0.25 s for a warm Llama 3
        # 8B FP8 step on an H100, about 5% of a CLI call), to say whether the FP8 gain is lost to launch gaps
        # (fp8_host_bound; audit 58a). One device only: a cluster step or a search row would pay a second schedule
        from dataclasses import replace as _replace

        from wattcast.simulate.single_device import fp8_host_bound, with_warnings

        twin = predict_graph(step_graph(model, _replace(opts, dtype="bf16", fp8_recipe=None),
                                        example_inputs=example_inputs), spec, bundle, power_limit_w=power_limit_w,
                             clock_cap_mhz=clock_cap_mhz, launch_overhead_ms=launch_ms, host_model=host_model)
        twin = one_device(twin, load_ms=data_load_ms, workers=data_workers, idle_power_w=idle_power_w(spec))
        cmp_, note = fp8_host_bound(res, twin, 1e3 * launch_ms)
        res = _replace(res, meta=with_warnings(dict(res.meta, fp8_vs_bf16=cmp_), [note] if note else []))
    if engine is not None:
        res = _served(res, model, spec, opts, engine, int(prompt_tokens), int(output_tokens), bundle=bundle,
                      power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz, idle_power_w=idle_power_w(spec))
    b, s_ = res.meta.get("batch"), res.meta.get("seq")
    m = res.meta
    settings = dict(_model_settings(model, m), device=res.device, mode=m.get("mode", mode), dtype=shown_dtype(m, dtype),
                    batch=b, seq=s_, **_attention_settings(m, attention),
                    compile=bool(m.get("compile", compile)),
                    optimizer=m.get("optimizer", optimizer) if m.get("mode", mode) == "train" else None,
                    optimizer_impl=m.get("optimizer_impl") if m.get("mode", mode) == "train" else None,
                    recompute=m.get("recompute", recompute), grad_accumulation=bool(grad_accumulation), framework="hf",
                    power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz, data_load_ms=data_load_ms,
                    data_workers=(m.get("data_loading") or {}).get("workers", data_workers), dims=dict(dims) if dims else None,
                    loop_trip_count=loop_trip_count, kv_context=m.get("kv_context", kv_context),
                    logits=m.get("logits", logits),
                    **({"fp8_recipe": m["fp8_scaling"]} if m.get("fp8_scaling") else {}),
                    host_us=_shown_host_us(launch_ms),  # the host cost per launch assumed, given or not
                    **({"serving": engine, "prompt_tokens": int(prompt_tokens), "output_tokens": int(output_tokens)}
                       if engine is not None else {}))
    if tokens is None:
        _no_run_options(run_kw)
        return _with_settings(res, settings)
    if not (b and s_):
        from wattcast.request import StepTokensUnknownError

        raise StepTokensUnknownError("tokens= needs the step's tokens: this graph's batch and sequence dims are not known")
    return _with_settings(_with_run(res, spec, tokens, b * s_, run_kw), settings)


def _predict_tp_inference(model, cluster, *, gpus, tp, batch, seq, kv_context, logits, serving, prompt_tokens,
                          output_tokens, dtype, attention, compile, device, power_limit_w, clock_cap_mhz, framework,
                          gpus_per_node, given: dict, host_us: float | None = None):
    """:func:`predict_cluster`'s KV-cached inference: one node's tensor-parallel group (``simulate/tp_inference.py``),
    each rank's graph costed with its collectives over the node's link, then (``serving``) as a serving iteration."""
    from wattcast.data.catalog import resolve_device
    from wattcast.data.cluster_spec import resolve_cluster, using_gpus_per_node
    from wattcast.data.device_spec import DeviceSpec
    from wattcast.featurize.te_attention import vllm_flash_kernel
    from wattcast.featurize.workload import StepOptions, step_graph
    from wattcast.models.power import idle_power_w
    from wattcast.simulate.defaults import shown_dtype, step_dtype
    from wattcast.simulate.distributed import collective_model
    from wattcast.simulate.serving import check_serving
    from wattcast.simulate.single_device import predict_graph
    from wattcast.simulate.tp_inference import check_tp_serving, tp_collective_fn, tp_summary

    spec = device if isinstance(device, DeviceSpec) or device is None else resolve_device(device)
    cl = resolve_cluster(cluster, device=spec.name if spec is not None else None)
    if gpus_per_node is not None:
        cl = using_gpus_per_node(cl, gpus_per_node)
    spec = spec or resolve_device(cl.device)
    tp = check_tp_serving(gpus=gpus, tp=tp, gpus_per_node=cl.gpus_per_node, framework=framework, given=given)
    engine = check_serving(serving, kv_context=kv_context, seq=seq, mode="inference", prompt_tokens=prompt_tokens,
                           output_tokens=output_tokens)
    opts = StepOptions(batch=batch, seq=seq, mode="inference", dtype=step_dtype(dtype, spec), attention=attention,
                       compile=compile, tp=tp, kv_context=kv_context, logits=logits,
                       flash_kernel=vllm_flash_kernel(spec),  # vLLM's attention class (FA3 on Hopper)
                       fused_moe=True)  # the group as vLLM runs it: its fused MoE kernels (hf_models._moe_vllm_fused)
    graph = step_graph(model, opts)
    coll = tp_collective_fn(collective_model(), cl, tp)
    from wattcast.simulate.single_device import step_host_cost

    # the host costs of predict's one-device step (tp=1 is that step)
    launch_ms, host_model = step_host_cost(compile=bool(compile), served=engine is not None, host_us=host_us)
    res = predict_graph(graph, spec, power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz, collective_ms=coll,
                        launch_overhead_ms=launch_ms, host_model=host_model)
    from wattcast.simulate.data_loading import one_device

    res = one_device(res, load_ms=0.0, workers=None, idle_power_w=idle_power_w(spec))  # the batch's copy, as predict's
    info = tp_summary(graph, res, tp=tp, cluster_name=cl.name)
    if engine is not None:
        res = _served(res, model, spec, opts, engine, int(prompt_tokens), int(output_tokens), bundle=None,
                      power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz, idle_power_w=idle_power_w(spec),
                      collective_ms=coll, tp=tp)
        info.update(energy_all_gpus_j=float(res.energy_j) * tp, avg_power_all_gpus_w=float(res.avg_power_w) * tp)
    res.meta["tensor_parallel"] = info
    m = res.meta
    settings = dict(_model_settings(model, m), device=res.device, cluster=cl.name, gpus=tp, tp=tp, mode="inference",
                    dtype=shown_dtype(m, dtype), batch=m.get("batch"), seq=m.get("seq"),
                    attention=m.get("attention", attention), flash_kernel=m.get("flash_kernel"),
                    compile=bool(m.get("compile", compile)), framework="hf", power_limit_w=power_limit_w,
                    clock_cap_mhz=clock_cap_mhz, gpus_per_node=gpus_per_node, kv_context=m.get("kv_context", kv_context),
                    logits=m.get("logits", logits), host_us=_shown_host_us(launch_ms),
                    **({"serving": engine, "prompt_tokens": int(prompt_tokens), "output_tokens": int(output_tokens)}
                       if engine is not None else {}))
    return _with_settings(res, settings)


def _served(res, model, spec, opts, engine: str, prompt_tokens: int, output_tokens: int, *, bundle, power_limit_w,
            clock_cap_mhz, idle_power_w: float, collective_ms=None, tp: int = 1):
    """The decode step ``res`` as a serving engine's iteration (``simulate/serving.py``): its prefill is the same
    model's ``kv_context=0`` step of ``prompt_tokens`` for the requests that arrive together."""
    from dataclasses import replace

    from wattcast.featurize.workload import step_graph
    from wattcast.simulate.serving import check_batch, prefill_batch, with_serving
    from wattcast.simulate.single_device import predict_graph

    k = int(prefill_batch(check_batch(res.meta.get("batch")), output_tokens))
    pre_opts = replace(opts, batch=k, seq=prompt_tokens, kv_context=0)
    from wattcast.simulate.single_device import step_host_cost

    launch_ms, host_model = step_host_cost(served=True)  # the engine's prefill, costed as its serving fit had it
    prefill = predict_graph(step_graph(model, pre_opts), spec, bundle, power_limit_w=power_limit_w,
                            clock_cap_mhz=clock_cap_mhz, collective_ms=collective_ms, launch_overhead_ms=launch_ms,
                            host_model=host_model)
    served = with_serving(res, prefill, engine=engine, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                          prefill_requests=k, idle_power_w=idle_power_w, tp=tp)
    # the prefill runs on the same GPU between decode iterations: its warnings (a prompt beyond the model's positions,
    # ...) and its memory (k prompts' activations beside the weights and cache) belong to the served iteration too
    from wattcast.simulate.single_device import with_warnings

    notes = [f"serving prefill ({k} x {prompt_tokens} tokens): {w}" for w in prefill.meta.get("warnings") or []
             if w not in (res.meta.get("warnings") or [])]
    # peak: the weights and the running sequences' cache stay; the prefill's activations and working set replace the
    # decode step's while it runs (its prompts' cache takes the place of the finished requests')
    m, p = served.memory, prefill.memory
    mem = replace(m, activations_gb=max(m.activations_gb, p.activations_gb), transient_gb=max(m.transient_gb, p.transient_gb))
    return replace(served, memory=mem, memory_gb=served.memory_gb + mem.total_gb - m.total_gb,
                   meta=with_warnings(served.meta, notes))


def _attention_settings(meta: dict, attention: str) -> dict:
    """``settings``' ``attention`` and ``flash_kernel``: what the step was costed with. An imported graph (ONNX,
    torch.export: ``meta["attention_costed"]``) holds the attention its file or module wrote -- an ONNX MatMul ->
    Softmax -> MatMul core is eager, an ``Attention`` op and a torch.export ``scaled_dot_product_attention`` under
    "flash" the fused kernel; None when it has none -- so that is what is reported; an ``attention`` given
    (``--attention``; "flash", the default, counts as not given) that the graph was not costed with is a GraphError
    naming the flag, not an option silently ignored. (Until stop 57 the settings echoed the option asked for: an ONNX
    GPT costed with its softmax and bmm kernels said "flash" / "fa2", and a module's SDPA costed as flash said
    "eager".)"""
    if meta.get("source") not in ("onnx", "torch.export"):
        return dict(attention=meta.get("attention", attention), flash_kernel=meta.get("flash_kernel"))
    from wattcast.featurize.op_graph import GraphError

    costed = meta.get("attention_costed")
    asked = str(attention).lower()
    if asked != DEFAULTS.attention and costed is not None and costed != asked:
        src = meta.get("source")
        how = {"eager": "its own matmul, softmax and matmul kernels, costed as written",
               "flash": ("an Attention op, costed as the fused kernel (FlashAttention-2 class)" if src == "onnx" else
                         "scaled_dot_product_attention costed as the fused kernel (FlashAttention-2 class)")}.get(
            costed, f"costed as {costed} (the kernels it holds)")
        hint = (" (only F.scaled_dot_product_attention takes eager, flash, flash1 or flash3)" if src == "torch.export" else "")
        raise GraphError(f"{meta.get('name') or 'the model'}: attention {asked!r} (--attention) cannot be applied: the "
                         f"{'ONNX' if src == 'onnx' else 'torch.export'} graph's attention is {how}{hint}; leave "
                         f"--attention out (the settings then say {costed}), or give --attention {costed.split('+')[0]}")
    return dict(attention=costed, flash_kernel=(meta.get("flash_kernel") or "fa2") if costed == "flash" else
                {"flash1": "fa1", "flash3": "fa3"}.get(costed))


def _shown_host_us(launch_ms: float) -> float:
    """``settings["host_us"]``: the host cost per kernel launch (us) the step was costed with, whether ``host_us`` was
    given or the default was taken (``simulate.single_device.step_host_cost``: 40 eager PyTorch, 6 under
    ``compile`` or ``serving``; a cluster's ``simulate.distributed.framework_launch_ms``: the framework preset's)."""
    return round(float(launch_ms) * 1e3, 9)


def _model_settings(model, meta: dict) -> dict:
    """``model`` as given (a name or a path; a config dict or module by its name) and the name it resolved to."""
    given = str(model) if isinstance(model, (str, os.PathLike)) else meta.get("name")
    return dict(model=given, model_name=meta.get("name"))


def _with_settings(res, settings: dict):
    """``res`` with the settings it ran with in ``res.meta["settings"]`` (what the CLI's title shows and the rest of the
    options that shaped the step: dtype, batch, seq, attention, optimizer, recompute, mode, framework, ...), which its
    ``to_dict()`` (hence ``wattcast predict --json``) gives as ``settings``."""
    res.meta["settings"] = settings
    return res


#: the run options ``tokens=`` takes (as ``wattcast predict --tokens``)
RUN_OPTIONS = ("region", "pue", "lifetime_years", "grid_kgco2e_per_kwh", "market_based", "electricity_usd_per_kwh",
               "cloud_usd_per_gpu_hour", "node_overhead_share", "assumptions", "mtbf_gpu_hours", "checkpoint_write_s",
               "pricing")


def _no_run_options(run_kw: dict) -> None:
    unknown = sorted(set(run_kw) - set(RUN_OPTIONS))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}")
    given = sorted(k for k, v in run_kw.items() if v is not None)
    if given:
        raise ValueError(f"{', '.join(given)} describe a run: give tokens= too")


def _no_served_run(tokens, run_kw: dict) -> None:
    """KV-cached inference on a cluster (predict_cluster's kv_context=) costs one served step, not a run: tokens= and
    the run options are refused saying so (not "give tokens= too" when tokens was given)."""
    unknown = sorted(set(run_kw) - set(RUN_OPTIONS))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}")
    given = (["tokens"] if tokens is not None else []) + sorted(k for k, v in run_kw.items() if v is not None)
    if given:
        raise ValueError(f"{', '.join(f'{k}=' for k in given)}: a whole run (tokens, energy, cost, CO2e) is not modelled "
                         "for KV-cached inference on a cluster (kv_context=): it costs one served step; leave "
                         f"{'it' if len(given) == 1 else 'them'} out")


def _with_run(res, spec, tokens, tokens_per_step, run_kw: dict, cluster=None):
    from dataclasses import replace

    from wattcast.lifecycle import run_of_prediction

    unknown = sorted(set(run_kw) - set(RUN_OPTIONS))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}")
    run = run_of_prediction(res, tokens=tokens, tokens_per_step=tokens_per_step, device=spec, cluster=cluster, **run_kw)
    if run.spare_gpus:  # the nodes' idle spares are charged with the run: said beside the other warnings too
        from wattcast.simulate.single_device import with_warnings

        res = replace(res, meta=with_warnings(res.meta, [f for f in run.flags if f.startswith(f"{run.spare_gpus} spare GPUs")]))
    return replace(res, run=run)


@_model_folder_options
def predict_cluster(model, cluster, *, gpus: int | None = None, batch: int | None = None, seq: int | None = None,
                    tp: int | None = None, pp: int | None = None, dp=None,
                    micro_batch=None, zero: int | None = None, sp: bool | None = None, ep: int | None = None,
                    recompute: str | None = None, recompute_modules=None, interleave: int | None = None,
                    schedule: str | None = None, dtype: str = DEFAULTS.dtype, attention: str = DEFAULTS.attention,
                    compile: bool = False, optimizer: str = DEFAULTS.optimizer, device=None, trace: bool | str | os.PathLike = False,
                    optimizer_impl: str | None = None,
                    power_limit_w: float | None = None, clock_cap_mhz: float | None = None,
                    framework: str = DEFAULTS.framework,
                    pp_first_stage_layers: int | None = None, pp_last_stage_layers: int | None = None, cp: int | None = None,
                    overlap_grad_reduce: bool | None = None, overlap_param_gather: bool | None = None,
                    tp_comm_overlap: bool | None = None, overlap_moe_expert_parallel_comm: bool | None = None,
                    overlap_p2p_comm: bool | None = None, async_tp_comm: bool | None = None,
                    recompute_num_layers: int | None = None, recompute_method: str | None = None,
                    strategy: str | None = None, cp_comm_type: str | None = None, hierarchical_cp_sizes=None,
                    moe_load_imbalance: float = 1.0, moe_capacity_factor: float | None = None,
                    moe_pad_to_capacity: bool = False, moe_token_dispatcher: str = "alltoall",
                    gpus_per_node: int | None = None,
                    zero3_prefetch: bool | None = None, data_load_ms: float = 0.0, data_workers: int | None = None,
                    scatter_gather_p2p: bool | None = None, grad_accum_dtype: str | None = None,
                    loop_trip_count: int | dict[str, int] | None = None, tokens: float | None = None,
                    fp8_param_gather: bool = False, fp8_recipe: str | None = None, etp: int | None = None,
                    mtp_num_layers: int = 0,
                    fsdp_reduce_dtype: str | None = None, cross_entropy_loss_fusion: bool | None = None,
                    cross_entropy_fusion_impl: str = "native", kv_context: int | None = None,
                    logits: str | None = None, serving: str | None = None, prompt_tokens: int | None = None,
                    output_tokens: int | None = None, host_us: float | None = None, **run_kw):
    """One training step of ``model`` on ``gpus`` GPUs of ``cluster`` under a parallel strategy.

    ``host_us``: each rank's host time per kernel launch (us; :func:`predict`'s; ``DistributedOptions.host_us``).

    ``kv_context`` (with ``logits``, ``serving``, ``prompt_tokens``, ``output_tokens`` as for :func:`predict`): instead,
    a KV-cached inference step (``seq=1``: a decode step; ``kv_context=0``: a prefill) of one tensor-parallel group of
    ``gpus == tp`` GPUs on one node, as vLLM serves it (``simulate/tp_inference.py``): a
    :class:`~wattcast.simulate.single_device.StepPrediction` of one GPU (memory, energy and power per GPU; ``tp=1``
    is :func:`predict`'s step on the cluster's device) with ``meta["tensor_parallel"]`` (its all-reduces, logits
    gather and the group's energy). Pipeline or data parallelism, groups across nodes and training options are
    refused (ValueError).

    ``batch`` is the global batch in sequences; ``seq`` its tokens per sequence, default 1,024, or an ONNX file's own
    (its fixed sequence dim; a model with no sequence axis, an MLP's or an image model's, runs one position per
    sample and ``settings["seq"]`` is None, as :func:`predict` gives it). Returns a
    :class:`wattcast.simulate.distributed.DistributedPrediction` (step time, MFU, HFU, TFLOP/s per GPU,
    exposed communication, pipeline bubble, per-device memory and busy time, ``fits``).
    ``trace``: True keeps the step's event timeline (``.events``); a file path also writes its Chrome trace there, as
    the CLI's ``--trace FILE`` (anything else: TypeError naming ``trace``).
    ``pp_first_stage_layers``/``pp_last_stage_layers``: transformer layers of the first/last pipeline stage (the rest
    split evenly); without them layers that do not divide are split automatically (``parallel.stage_layers``).
    ``cp``: context parallelism (ring attention over ``cp`` ranks; needs ``attention="flash"``).
    ``cp_comm_type``: how it communicates (Megatron-Core's ``--cp-comm-type``: "p2p", the ring, by default; "a2a",
    "allgather", "a2a+p2p" with ``hierarchical_cp_sizes=(A, B)``, A x B = cp; see the README's CP section).
    ``overlap_grad_reduce``/``overlap_param_gather``/``tp_comm_overlap``: Megatron-Core's overlaps (None: the
    framework's default, on for ``framework="megatron"`` as its recipes run; see ``simulate/overlap.py``);
    ``overlap_moe_expert_parallel_comm``: Megatron-Core's MoE all-to-all overlap (off by default; needs ``ep`` > 1).
    ``overlap_p2p_comm``: the interleaved schedule's point-to-point transfers beside the computation (Megatron-Core's
    default; False: each transfer blocks, as Megatron-LM 2021 ran them); given without ``interleave`` >= 2 it would
    change nothing and is refused (ValueError), as is ``zero3_prefetch`` given where no per-unit ZeRO-3 / FSDP
    collectives run.
    ``async_tp_comm``: the column-parallel linears' backward TP collective runs beside their weight-gradient GEMM
    (Megatron-Core's, the default with ``framework="megatron"`` and ``tp`` > 1; False: Megatron-LM 2021's synchronous
    all-reduce, or its ``--no-async-tensor-model-parallel-allreduce``; off by default under hf and megatron-deepspeed,
    where True is accepted too); True without ``tp`` > 1, or under DualPipe, is refused (ValueError).
    ``recompute_num_layers``: with ``recompute="full"``, Megatron's block recomputation: only the first N transformer
    layers of each model chunk are recomputed, the others keep their activations (None: every layer);
    ``recompute_method="uniform"``: Megatron's uniform method instead (every layer, each group of N layers' input kept);
    a method (block or uniform) given without ``recompute="full"`` is an error, as in Megatron.
    ``recompute_modules``: Megatron-Core's selective recomputation modules, as for ``wattcast.predict``.
    ``moe_load_imbalance`` / ``moe_capacity_factor`` / ``moe_pad_to_capacity``: mixture-of-experts routing as it loads
    the busiest expert-parallel rank (``simulate/moe_routing.py``; default balanced, dropless).
    ``moe_token_dispatcher``: Megatron-Core's ``--moe-token-dispatcher-type`` for a mixture-of-experts model under
    ``framework="megatron"``: "alltoall" (default) or "allgather" (all-gathers over the expert-TP x EP ranks, a
    reduce-scatter back; ``featurize.hf_models._moe_allgather``).
    ``zero3_prefetch``: with ``zero=3`` (FSDP), whether each layer's parameter all-gathers and gradient reduce-scatters
    run beside the computation (True) or in series with it (False); None: the framework's (``hf``: in series, chosen on
    MosaicML's PyTorch FSDP runs as an empirical compensation; ``simulate.distributed.FRAMEWORK_ZERO3_PREFETCH``).
    ``scatter_gather_p2p``: pipeline transfers scattered over the TP group and all-gathered on arrival (Megatron-LM
    2021's ``--scatter-gather-tensors-in-pipeline``, DeepSpeed's PartitionedTensor); None: the framework's
    (``simulate.distributed.FRAMEWORK_SCATTER_GATHER_P2P``: on for megatron-deepspeed, off for megatron as
    Megatron-Core); nothing to scatter under sequence parallelism.
    ``fsdp_reduce_dtype``: with ``framework="hf"`` and ``zero=3`` under half precision, PyTorch FSDP's
    ``MixedPrecision.reduce_dtype`` ("fp32", "bf16", "fp16"): the dtype of its gradient reduce-scatters (None: the
    parameters' half-precision dtype, Accelerate's and torch's default; Composer's ``mixed_precision: DEFAULT`` is
    "fp32"; ``simulate.distributed.dp_reduce_bytes``).
    ``grad_accum_dtype``: with ``framework="megatron-deepspeed"``, DeepSpeed's ``data_types.grad_accum_dtype``
    ("fp32" or "bf16"; None: the framework's, "fp32"). Under bf16 at ZeRO-1, "fp32" runs ``BF16_Optimizer`` (bf16
    gradients plus a whole-model fp32 accumulation buffer, 6 B/param, and an fp32 accumulation pass every micro-batch:
    BLOOM-176B's), "bf16" DeepSpeed's ZeRO optimizer (2 B/param of bf16 gradients, flat bf16 and fp32 copies of the
    rank's partition at the step, autograd's accumulation into bf16 gradients); a warning where it changes nothing,
    a ValueError under hf. With ``framework="megatron"`` the dtype of Megatron-LM's main-gradient buffer: "bf16" is
    its ``--grad-reduce-in-bf16`` (2 B/param of gradients, the DP reduction and tied-embedding all-reduce in bf16, the
    optimizer's fp32 cast of the rank's shard at the step), "fp32" ``--accumulate-allreduce-grads-in-fp32`` (None:
    Megatron-LM's default, fp32 for bf16; ``simulate.stage_memory.megatron_main_grad_bytes``).
    ``data_load_ms`` / ``data_workers``: the data loader's host time to produce one micro-batch (default 0: a tokenised
    stream) and its worker processes (None: the framework's, hf 0, megatron 2); the step also copies each micro-batch
    to the GPU and, with Megatron and TP > 1, broadcasts it (``simulate/data_loading.py``; ``comm["data_loading"]``).
    ``etp``: Megatron-Core's ``--expert-tensor-parallel-size`` (MoE models, ``framework="megatron"``): the routed
    experts' tensor-parallel degree, folded with ``ep`` over the attention's tp x cp x dp ranks (None: ``tp``).
    ``mtp_num_layers``: Megatron-Core's ``--mtp-num-layers`` (DeepSeek-V2/V3 configs, ``framework="megatron"``;
    DeepSeek-V3 trained with 1): multi-token-prediction depths on the last pipeline stage.
    ``cross_entropy_loss_fusion``: Megatron-Core's ``--cross-entropy-loss-fusion`` (``framework="megatron"``; None:
    the framework's default, on for megatron as Megatron-Bridge's recipes run it, off elsewhere) and
    ``cross_entropy_fusion_impl`` its ``--cross-entropy-fusion-impl``: "native" (Megatron-Core's jit-fused loss: 32
    bytes a logit in bf16 where the unfused loss moves 52, the same fp32 probabilities saved) or "te" (Transformer
    Engine's Triton kernels: 8 bytes a logit, a bf16 copy of the logits saved); see ``GraphBuilder.cross_entropy``.
    ``fp8_recipe`` (with ``dtype="fp8"``): Megatron-Core's ``--fp8-recipe`` (as ``wattcast.predict``'s).
    ``fp8_param_gather``: Megatron-Core's ``--fp8-param-gather`` (with ``dtype="fp8"``, ``zero`` >= 1 and
    ``framework="megatron"``): FP8 weights without a bf16 copy, cast shard by shard and all-gathered at 1 B.
    ``gpus_per_node``: use this many of each node's GPUs (e.g. 64 of an NVL72 rack's 72; ``data.cluster_spec.
    using_gpus_per_node``); the job then fills whole nodes of that many.
    ``strategy``: a strategy string as ``wattcast.search`` gives it per row (``simulate/strategy.py``, e.g.
    ``"tp2-pp1-dp32-cp1-ep1-mb2-ga8-zero1-v1-sp-rcnone-1f1b"``); it sets the parallel options, ``gpus`` and (with its
    ``ga``) ``batch``, and predicts that row's figures exactly. An option also given must agree with it (ValueError
    naming the option otherwise). Without ``strategy``, ``gpus`` and ``batch`` are required and the parallel options
    default to tp 1, pp 1, cp 1, ep 1, ZeRO 0, no SP, no recomputation, interleave 1 and 1F1B.
    ``loop_trip_count``: iterations of an ONNX model's Loops whose trip count is known only at run time (a count, or
    ``{node name: count}``), as for ``wattcast.predict``.
    ``tokens`` (and
    ``run_kw``: region, pue, lifetime_years, grid_kgco2e_per_kwh, ...): the whole run in ``.run``, the same
    figures as ``wattcast predict --cluster ... --tokens``.
    ``models`` / ``collectives`` / ``power_model``: folders of retrained models, as for :func:`predict`."""
    from wattcast.data.catalog import resolve_device
    from wattcast.data.device_spec import DeviceSpec
    from wattcast.simulate.distributed import predict_distributed
    from wattcast.simulate.options import DistributedOptions
    from wattcast.simulate.parallel import ParallelConfig

    trace_path = _trace_option(trace)
    trace = bool(trace)
    if any(v is not None for v in (kv_context, logits, serving, prompt_tokens, output_tokens)):
        if trace_path is not None:
            raise ValueError("trace= is the training step's event timeline; a KV-cached inference step (kv_context=, "
                             "logits=, serving=, ...) has none")
        from wattcast.request import check_inference_options

        # KV-cached inference: the training-only options refused as wattcast.predict(mode="inference") and the CLI do
        check_inference_options("inference", optimizer=optimizer, recompute=recompute, optimizer_impl=optimizer_impl,
                                recompute_modules=recompute_modules, default_optimizer=DEFAULTS.optimizer)
        given = dict(pp=pp, dp=dp, cp=cp, ep=ep, zero=zero, sp=sp, interleave=interleave, micro_batch=micro_batch,
                     recompute=recompute, recompute_modules=recompute_modules, strategy=strategy, etp=etp,
                     schedule=schedule, pp_first_stage_layers=pp_first_stage_layers,
                     pp_last_stage_layers=pp_last_stage_layers, recompute_num_layers=recompute_num_layers,
                     recompute_method=recompute_method, overlap_grad_reduce=overlap_grad_reduce,
                     overlap_param_gather=overlap_param_gather, tp_comm_overlap=tp_comm_overlap,
                     overlap_moe_expert_parallel_comm=overlap_moe_expert_parallel_comm,
                     overlap_p2p_comm=overlap_p2p_comm, async_tp_comm=async_tp_comm, zero3_prefetch=zero3_prefetch,
                     fsdp_reduce_dtype=fsdp_reduce_dtype, scatter_gather_p2p=scatter_gather_p2p,
                     grad_accum_dtype=grad_accum_dtype, fp8_param_gather=fp8_param_gather, mtp_num_layers=mtp_num_layers,
                     cross_entropy_loss_fusion=cross_entropy_loss_fusion, tokens=tokens, fp8_recipe=fp8_recipe,
                     optimizer_impl=optimizer_impl)
        if kv_context is None:
            raise ValueError("logits= / serving= / prompt_tokens= / output_tokens= on a cluster describe KV-cached "
                             "inference: give kv_context= too")
        _no_served_run(tokens, run_kw)
        return _predict_tp_inference(model, cluster, gpus=gpus, tp=tp, batch=batch, seq=seq, kv_context=kv_context,
                                     logits=logits, serving=serving, prompt_tokens=prompt_tokens,
                                     output_tokens=output_tokens, dtype=dtype, attention=attention, compile=compile,
                                     device=device, power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz,
                                     framework=framework, gpus_per_node=gpus_per_node, given=given, host_us=host_us)
    seq, shown_seq = _cluster_seq(model, seq)
    if recompute_modules is not None:
        from wattcast.featurize.recompute import recompute_setting

        recompute = recompute_setting(recompute or "none", recompute_modules)
    opts = dict(gpus=gpus, batch=batch, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, zero=zero, sp=sp, ep=ep,
                recompute=recompute, interleave=interleave, schedule=schedule, cp=cp, pp_first_layers=pp_first_stage_layers,
                pp_last_layers=pp_last_stage_layers, overlap_grad_reduce=overlap_grad_reduce,
                overlap_param_gather=overlap_param_gather, tp_comm_overlap=tp_comm_overlap,
                overlap_moe_expert_parallel_comm=overlap_moe_expert_parallel_comm, overlap_p2p_comm=overlap_p2p_comm,
                async_tp_comm=async_tp_comm, recompute_num_layers=recompute_num_layers, recompute_method=recompute_method, etp=etp,
                cp_comm_type=cp_comm_type,
                hierarchical_cp_sizes=None if hierarchical_cp_sizes is None else tuple(hierarchical_cp_sizes))
    if strategy is not None:
        from wattcast.simulate.strategy import strategy_values

        api = {"pp_first_layers": "pp_first_stage_layers", "pp_last_layers": "pp_last_stage_layers"}
        opts = strategy_values(strategy, {k: v for k, v in opts.items() if v is not None},
                               label=lambda k: api.get(k, k))
        opts.setdefault("batch", None)
    from wattcast.request import parallel_defaults

    defaults = dict(parallel_defaults(), recompute="none")
    # not filled in: a method given without full recomputation is refused (resolve_parallel), the default applies alone
    defaults.pop("recompute_method", None)
    opts = {k: (defaults[k] if v is None and k in defaults else v) for k, v in opts.items()}
    if opts.get("cp_comm_type") is None:  # not given (nor by a strategy): the ring, Megatron-Core's default
        opts["cp_comm_type"] = "p2p"
    # flags given (or a strategy's tokens) that would change nothing are refused, not ignored (the defaults never are)
    from wattcast.featurize.workload import canonical_framework as _fw_name
    from wattcast.simulate.distributed import check_zero3_prefetch_flag
    from wattcast.simulate.parallel import check_overlap_p2p_flag

    check_overlap_p2p_flag(opts.get("overlap_p2p_comm"), opts.get("interleave"))
    if zero3_prefetch is not None:
        check_zero3_prefetch_flag(zero3_prefetch, _fw_name(framework), opts.get("zero"))
    for k in ("gpus", "batch"):
        if opts[k] is None:
            raise TypeError(f"predict_cluster() needs {k}= (or a strategy= that sets it"
                            + (": the strategy's ga<N> gives the global batch)" if k == "batch" else ")"))
    gpus, batch = opts.pop("gpus"), opts.pop("batch")
    par = ParallelConfig(gpus=gpus, **opts)
    if tokens is None:
        _no_run_options(run_kw)
    # resolved once, first: the run's cost and carbon use this spec's own figures, never a catalog entry of the same name
    spec = device if isinstance(device, DeviceSpec) or device is None else resolve_device(device)
    if gpus_per_node is not None:
        from wattcast.data.cluster_spec import resolve_cluster, using_gpus_per_node

        cluster = using_gpus_per_node(resolve_cluster(cluster, device=spec.name if spec is not None else None),
                                      gpus_per_node)
    res = predict_distributed(model, cluster, par, DistributedOptions(
        batch=batch, seq=seq, dtype=dtype, attention=attention, compile=compile, optimizer=optimizer,
        optimizer_impl=optimizer_impl, device=spec,
        trace=trace, power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz, framework=framework,
        loop_trip_count=loop_trip_count, moe_load_imbalance=moe_load_imbalance, moe_capacity_factor=moe_capacity_factor,
        moe_pad_to_capacity=moe_pad_to_capacity, moe_token_dispatcher=moe_token_dispatcher,
        zero3_prefetch=zero3_prefetch, data_load_ms=data_load_ms,
        data_workers=data_workers, fp8_param_gather=fp8_param_gather, fp8_recipe=fp8_recipe,
        mtp_num_layers=mtp_num_layers, fsdp_reduce_dtype=fsdp_reduce_dtype,
        cross_entropy_loss_fusion=cross_entropy_loss_fusion,
        cross_entropy_fusion_impl=cross_entropy_fusion_impl, scatter_gather_p2p=scatter_gather_p2p,
        grad_accum_dtype=grad_accum_dtype, host_us=host_us))
    from wattcast.featurize.workload import canonical_framework, ce_fusion_options
    from wattcast.simulate.defaults import shown_dtype
    from wattcast.simulate.distributed import framework_launch_ms
    from wattcast.simulate.strategy import StrategyError, format_strategy

    m, fw = res.meta, canonical_framework(framework)
    try:
        strategy_text = format_strategy(res.parallel, batch, fw)
    except StrategyError:
        strategy_text = None
    settings = dict(_model_settings(model, m), device=res.device, cluster=res.cluster, gpus=res.gpus, mode="train",
                    dtype=shown_dtype(m, dtype), batch=batch, seq=shown_seq, micro_batch=res.parallel.micro_batch,
                    **_attention_settings(m, attention),
                    compile=bool(m.get("compile", compile)), optimizer=m.get("optimizer", optimizer),
                    optimizer_impl=m.get("optimizer_impl"), recompute=res.parallel.recompute, framework=fw, strategy=strategy_text,
                    power_limit_w=power_limit_w, clock_cap_mhz=clock_cap_mhz, gpus_per_node=gpus_per_node,
                    moe_load_imbalance=moe_load_imbalance, moe_capacity_factor=moe_capacity_factor,
                    moe_pad_to_capacity=moe_pad_to_capacity, zero3_prefetch=m.get("zero3_prefetch"),
                    **({"moe_token_dispatcher": moe_token_dispatcher} if moe_token_dispatcher != "alltoall" else {}),
                    fsdp_reduce_dtype=fsdp_reduce_dtype, grad_accum_dtype=m.get("grad_accum_dtype"),
                    fp8_param_gather=bool(fp8_param_gather), mtp_num_layers=mtp_num_layers, data_load_ms=data_load_ms,
                    **({"fp8_recipe": m["fp8_scaling"]} if m.get("fp8_scaling") else {}),
                    **ce_fusion_options(cross_entropy_loss_fusion, cross_entropy_fusion_impl, fw),
                    data_workers=(res.comm.get("data_loading") or {}).get("workers", data_workers),
                    loop_trip_count=loop_trip_count,
                    host_us=_shown_host_us(framework_launch_ms(fw, bool(compile), host_us)))
    if tokens is None:
        return _traced(_with_settings(res, settings), trace_path)
    if shown_seq is None:
        from wattcast.request import StepTokensUnknownError

        raise StepTokensUnknownError("tokens= needs the step's tokens: this ONNX model has no sequence axis")
    from wattcast.data.cluster_spec import resolve_cluster

    return _traced(_with_settings(_with_run(res, spec or resolve_device(res.device), tokens, batch * seq, run_kw,
                                            cluster=resolve_cluster(cluster)), settings), trace_path)


def _trace_option(trace) -> str | os.PathLike | None:
    """``predict_cluster``'s ``trace``: True / False (keep the event timeline in ``.events``) or a file path, where the
    step's Chrome trace is written as ``wattcast predict --cluster ... --trace FILE`` writes it (the events are kept
    too). Anything else is a TypeError naming ``trace``: until stop 58 a path was taken for True and nothing was
    written (audit 58e finding 6)."""
    import numpy as np

    if isinstance(trace, (bool, np.bool_)):
        return None
    if isinstance(trace, (str, os.PathLike)):
        if not str(trace).strip():
            raise ValueError("trace= is an empty path: give a file to write the Chrome trace to, or True / False")
        return trace
    raise TypeError(f"trace= must be True, False or a file path (str or os.PathLike), got {type(trace).__name__} "
                    f"{trace!r}")


def _traced(res, path):
    """``res``, its Chrome trace written to ``path`` first (None: nothing written)."""
    if path is not None:
        from wattcast.simulate.trace import write_distributed_trace

        write_distributed_trace(res, path)
    return res


def _cluster_seq(model, seq: int | None) -> tuple[int, int | None]:
    """(the tokens per sequence a cluster step runs, the one its settings show) for ``seq`` given or None: 1,024 by
    default; an ONNX file's own as :func:`predict` takes it (its fixed sequence dim, 1,024 for a symbolic one), and for
    a model with no sequence axis 1 (one position per sample), shown as None. Until stop 54 a cluster step always
    applied 1,024, so an ONNX MLP or CNN could not be predicted on a cluster at all."""
    from wattcast.featurize.workload import is_onnx_path

    if seq is not None:
        return seq, seq
    if not is_onnx_path(model):
        return 1024, 1024
    from wattcast.featurize.onnx.load import onnx_own_seq

    kind, own = onnx_own_seq(model)
    if kind is None:
        return 1, None
    return (own, own) if kind == "fixed" else (1024, 1024)


def search(model, cluster, gpus: int, batch: int, seq: int = 1024, **kw):
    """Enumerate valid parallel strategies, evaluate them (shared caches), rank them; Pareto front over step
    time and memory. Every row has a ``strategy`` string that ``predict_cluster(..., strategy=)`` predicts exactly,
    given the same step options (``dtype``, ``framework``, and the ones no token records: ``grad_accum_dtype``,
    ``fsdp_reduce_dtype``, ``fp8_recipe`` and ``fp8_param_gather``; the last two are also each row's ``fp8_recipe`` /
    ``fp8_param_gather`` columns and, with the others, the result's ``settings``).
    With ``tokens`` (and ``footprint_kw``: region, pue, lifetime_years, grid_kgco2e_per_kwh, cloud_usd_per_gpu_hour,
    ...): each fitting row's run days, cloud cost, TCO, energy and CO2e with their sources; ``objective`` (time, cost,
    tco, co2e, energy), ``max_usd``, ``deadline_days``, ``max_tco2e`` and ``pareto`` (time x cloud cost x CO2e) rank and
    filter them. ``models`` / ``collectives`` / ``power_model``: retrained model folders, as for :func:`predict`
    (every worker process loads the same ones). See :func:`wattcast.planning.search.search` for the search space
    options."""
    from wattcast.planning.search import search as _search

    return _search(model, cluster, gpus, batch, seq, **kw)


def footprint(device, gpus: int, hours: float, *, avg_power_w: float | None = None, utilisation: float = 0.5,
              apply_goodput: bool = False, power_model=None, **kw):
    """Lifecycle footprint (energy, operational/embodied CO2e, CapEx/OpEx/TCO, goodput) of ``gpus`` x ``device``
    for ``hours`` of wall-clock time. ``avg_power_w``: measured all-in power per accelerator (Patterson et
    al.'s convention); else ``power_model`` (GPU power in W, or a callable ``f(utilisation) -> W``; node overhead
    added); without either, the power surrogate's GPU power at ``utilisation`` plus node overhead.
    ``apply_goodput``: False by default here (``hours`` are measured wall-clock time, as published footprints report
    them, goodput 1); True takes them as failure-free and adds the time failures, checkpoints and restarts cost, as
    :func:`wattcast.lifecycle.footprint` does by default (and every run of predicted steps). The result says which in
    ``goodput_applied``. ``kw``: region, pue, grid_kgco2e_per_kwh, lifetime_years, ..., and ``gpus_per_node`` with
    ``node_gpus`` (the run uses that many of each node's GPUs: the idle spares of the nodes it holds are charged with
    it) (see wattcast.lifecycle.footprint)."""
    from wattcast.data.catalog import resolve_device
    from wattcast.simulate.energy import gpu_power_at_w
    from wattcast.lifecycle import footprint as _fp

    if avg_power_w is not None and power_model is not None:
        raise ValueError("avg_power_w gives the measured all-in power itself and power_model models the GPU's: give "
                         "one of them")
    spec = resolve_device(device)
    kw = {k: v for k, v in kw.items() if v is not None}
    if avg_power_w is not None:
        return _fp(spec, gpus, hours, avg_power_w=avg_power_w, apply_goodput=apply_goodput, **kw)
    if power_model is None:
        power_model = lambda u: gpu_power_at_w(spec, u)  # noqa: E731
    return _fp(spec, gpus, hours, power_model=power_model, utilisation=utilisation, apply_goodput=apply_goodput, **kw)


def builtin_models() -> list[str]:
    """Names of the model configs shipped with wattcast."""
    from wattcast.featurize.hf_config import builtin_models as _b

    return _b()


def __dir__() -> list[str]:
    """``dir(wattcast)``: the module's names without what its own code imports (``os``, the ``annotations`` future)."""
    return sorted(set(globals()) - {"os", "annotations"})


__all__ = ["predict_kernels", "predict", "predict_cluster", "search", "footprint", "builtin_models", "allow_exotic",
           "PredictRequest", "ParallelOptions", "RunOptions", "__version__"]
