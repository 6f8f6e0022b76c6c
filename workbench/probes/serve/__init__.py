"""Notebook 10: train against serve (what each serving engine makes of the adapter, its template, the merge)."""
