"""Planning on top of the whole stack: the strategy search (``search.py``) ranks parallel strategies by step time and,
with a run length, by the run's cost, energy and CO2e (:mod:`wattcast.lifecycle`). It sits above ``simulate/``
(which times one step) and ``lifecycle/`` (which costs a run); nothing below imports it."""
