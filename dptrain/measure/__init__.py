"""Measurement: where each step's time goes (``timing``), live progress (``progress``),
scaling sweeps (``sweep`` runs them, ``summary`` makes their rows and tables), the fitted
performance model (``perfmodel``), the figures (``plots``, needs matplotlib) and the ``plot``
command that joins the last two (``plot_command``). Import the module you need: ``from
dptrain.measure import sweep``; nothing here is loaded with ``import dptrain`` beyond what
training uses."""
