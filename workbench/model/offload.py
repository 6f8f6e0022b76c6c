"""Which parameters of a loaded model are offloaded: accelerate keeps their values elsewhere.

`device_map` with cpu/disk entries (`--device-map auto --max-memory ...`, or a map naming "disk") makes
accelerate's `dispatch_model` put every offloaded parameter on the meta device and attach a hook that loads a
temporary copy of its value (from CPU memory or the disk's memmap files) before each forward of its module and
drops it after. Two consequences the probes must respect:

- the model cannot be moved or copied as a whole: `model.to(...)` raises "You can't move a model that has some
  modules offloaded to cpu or disk" (accelerate big_modeling.py, its `add_warning` wrapper), which the Trainer's
  `accelerator.prepare` calls; a `copy.deepcopy` holds meta tensors, not weights;
- a backward reaches the temporary copies, never the parameters: a parameter on meta gets no `.grad`, whatever the
  model does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def offloaded_parameters(model: nn.Module) -> list[str]:
    """Names of the parameters accelerate holds offloaded (on the meta device), in `named_parameters` order."""
    return [name for name, p in model.named_parameters() if p.device.type == "meta"]


def offload_sentence(names: list[str]) -> str:
    """One sentence naming how many parameters are offloaded, with the first of them."""
    shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
    return f"{len(names)} parameter(s) offloaded by accelerate's device map (on the meta device: {shown})"
