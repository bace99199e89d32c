"""Measurement: where each step's time goes (``timing``), live progress (``progress``),
scaling sweeps (``sweep``), the fitted performance model (``perfmodel``) and the figures
(``plots``, needs matplotlib). Import the module you need: ``from dptrain.measure import
sweep``; nothing here is loaded with ``import dptrain`` beyond what training uses."""
