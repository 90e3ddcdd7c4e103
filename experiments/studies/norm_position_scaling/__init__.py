"""The norm_position_scaling study: its sweep file (README.md has the question, the commands and the result)."""
