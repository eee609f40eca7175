"""Glue between the Hub package and the libraries users run (diffusers, transformers).

Lives outside ``torch-ext/``: it may import anything; the Hub package may not import it.
"""
