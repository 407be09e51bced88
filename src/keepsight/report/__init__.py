"""Plots (matplotlib) and the HTML report of ``keepsight demo``."""
