"""Analyses of trained runs that the results docs cite: each module is a command (its docstring says which)."""
