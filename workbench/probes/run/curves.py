"""The run's curves: loss (and eval loss), grad_norm and learning rate against step, the anomalies marked."""

from __future__ import annotations

import numpy as np

from workbench.probes.run.trainer_state import Mark, TrainingLog

_COLOURS = {"loss": "#1565c0", "eval_loss": "#ef6c00", "grad_norm": "#2e7d32", "learning_rate": "#6a1b9a"}


def draw_curves(log: TrainingLog, marks: list[Mark]):
    """A matplotlib Figure of three panels sharing the step axis; non-finite values drawn at the panel's top."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 6.2))
    axes = fig.subplots(3, 1, sharex=True)
    series = {"loss": log.loss, "grad_norm": log.grad_norm, "learning_rate": log.learning_rate}
    for ax, name in zip(axes, ("loss", "grad_norm", "learning_rate")):
        values = series[name]
        ok = np.isfinite(values)
        ax.plot(log.step[ok], values[ok], color=_COLOURS[name], lw=1, label=name)
        if name == "loss" and len(log.eval_step):
            ev = np.isfinite(log.eval_loss)
            ax.plot(log.eval_step[ev], log.eval_loss[ev], "o-", color=_COLOURS["eval_loss"], ms=3, lw=1,
                    label="eval_loss")
        top = float(np.max(values[ok])) if ok.any() else 1.0
        if (~ok).any():
            ax.plot(log.step[~ok], np.full(int((~ok).sum()), top), "x", color="#c62828", ms=5, label="nan/inf")
        if name == "grad_norm" and ok.any() and float(np.min(values[ok & (values > 0)], initial=np.inf)) > 0 and \
                top / max(float(np.min(values[ok & (values > 0)], initial=top)), 1e-12) > 100:
            ax.set_yscale("log")
        ax.set_ylabel(name, fontsize=9)
        for mark in marks:
            target = "loss" if mark.series == "eval_loss" else mark.series
            if target != name:
                continue
            source = log.eval_step if mark.series == "eval_loss" else log.step
            column = log.eval_loss if mark.series == "eval_loss" else values
            at = np.isin(source, mark.steps)
            ys = np.where(np.isfinite(column[at]), column[at], top)
            ax.plot(source[at], ys, "v", color="#c62828", ms=6, mfc="none")
            ax.annotate(mark.label, (float(source[at][0]), float(ys[0])), fontsize=8, color="#c62828",
                        xytext=(4, 6), textcoords="offset points") if at.any() else None
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    return fig
