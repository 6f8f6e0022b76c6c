"""The display model, a leaf package: nodes that render to HTML and text (`nodes`), plain-text tables (`text`), the
findings table and figures (`findings_view`), and the bases every shown object derives from (`result`).

It imports nothing of the workbench but `workbench.findings` (pure data), so every layer may use it.
"""
