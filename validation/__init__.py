"""Validation: the finished models' predictions against measurements they were not fitted on (NeuSight labels, vTrain,
MPT, published runs, footprints, real traces). Downstream of every layer (it predicts through ``simulate``); nothing
in ``training`` or at prediction time imports it."""
