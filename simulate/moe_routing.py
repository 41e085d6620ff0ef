"""Mixture-of-experts routing as it loads the busiest expert-parallel rank: pure functions.

Every MoE layer's all-to-alls make each rank wait for the busiest one, so a layer costs what the rank whose experts
received the most tokens spends. With balanced routing (the default) every expert gets ``tokens x top_k / experts``;
real routers are not balanced: an auxiliary load-balancing loss keeps the busiest rank some way above the mean, a
figure that depends on the model, the data and the training step, so it is the user's to give
(``moe_load_imbalance``, busiest rank over the mean). Megatron-Core's ``--moe-expert-capacity-factor C`` caps every
expert at C times its balanced share and drops the rest (``--moe-token-drop-policy``), and
``--moe-pad-expert-input-to-capacity`` pads every expert to exactly that capacity (static shapes, e.g. for FP8).
"""

from __future__ import annotations

from wattcast.data.checks import real_in
from wattcast.featurize.workload import MOE_LOAD_MAX as _MAX_FACTOR

#: the routing options (``DistributedOptions`` fields, API keywords) and their defaults: balanced and dropless
ROUTING_DEFAULTS = {"moe_load_imbalance": 1.0, "moe_capacity_factor": None, "moe_pad_to_capacity": False}


class MoERoutingError(ValueError):
    """MoE routing options that do not make sense (the message names the option)."""


def given_routing(options: dict) -> dict:
    """The routing options of ``options`` that differ from :data:`ROUTING_DEFAULTS` (None and False count as not given)."""
    return {k: v for k, v in options.items() if v is not None and v is not False and v != ROUTING_DEFAULTS.get(k)}


def check_routing(options: dict | None) -> dict:
    """Routing options as a search or a sweep takes them (a mapping of :data:`ROUTING_DEFAULTS` keys), checked: an
    unknown key or a bad value raises (ValueError / :class:`MoERoutingError` naming it); returns the given ones."""
    given = dict(options or {})
    unknown = sorted(set(given) - set(ROUTING_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown MoE routing option(s) {unknown}; valid: {', '.join(ROUTING_DEFAULTS)}")
    given = given_routing(given)
    moe_load_factor(imbalance=given.get("moe_load_imbalance", 1.0), capacity_factor=given.get("moe_capacity_factor"),
                    pad_to_capacity=given.get("moe_pad_to_capacity", False), ep=2)  # raises naming the option
    return given


def moe_load_factor(*, imbalance: float = 1.0, capacity_factor: float | None = None, pad_to_capacity: bool = False,
                    ep: int = 1) -> float:
    """Tokens the busiest rank's experts process over their balanced share.

    - ``imbalance``: the busiest expert-parallel rank's tokens over the mean (>= 1). With one expert-parallel rank
      (``ep`` 1) that rank holds every expert and processes every routed token whatever the routing: 1.
    - ``capacity_factor`` (Megatron-Core's ``--moe-expert-capacity-factor``): each expert keeps at most that many times
      its balanced share; tokens beyond are dropped, so the busiest rank processes ``min(imbalance, C)``.
    - ``pad_to_capacity`` (``--moe-pad-expert-input-to-capacity``, needs a capacity factor): every expert processes
      exactly its capacity, ``C`` times the balanced share, on every rank.
    """
    imb = real_in(imbalance, 1.0, _MAX_FACTOR)
    if imb is None:
        raise MoERoutingError(f"--moe-load-imbalance is the busiest expert-parallel rank's tokens over the mean: a number "
                              f"from 1 (balanced) to {_MAX_FACTOR:g}, got {imbalance!r}")
    if not isinstance(pad_to_capacity, bool):
        raise MoERoutingError(f"--moe-pad-expert-input-to-capacity must be true or false, got {pad_to_capacity!r}")
    load = imb if int(ep) > 1 else 1.0
    if capacity_factor is None:
        if pad_to_capacity:
            raise MoERoutingError("--moe-pad-expert-input-to-capacity pads each expert to its capacity: it needs "
                                  "--moe-expert-capacity-factor")
        return load
    c = real_in(capacity_factor, 0.0, _MAX_FACTOR, lo_open=True)
    if c is None:
        raise MoERoutingError(f"--moe-expert-capacity-factor is each expert's capacity over its balanced share: a number "
                              f"above 0 and at most {_MAX_FACTOR:g}, got {capacity_factor!r}")
    if pad_to_capacity:
        return c
    return min(load, c)
