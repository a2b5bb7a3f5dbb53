"""Optimizer passes: one module per pass, each a function from Program to Program."""
