"""Spending: prices, the run's bill and budget, per-task limits, projections, a fork's accounting."""
