"""Why a trainable tensor got no gradient, read from what the forward did (`loss_reach`) and, for a zero
gradient, from whether the loss moves with the tensor (`loss_dependence`).

Each cause is either the truth about this model and batch (`BENIGN`: reported as info, counted and named) or a
break (reported as fail, with its site and fix).
"""

from __future__ import annotations

import inspect
import re

from torch import nn

from workbench.probes.forward.loss_reach import CutSite, library_of

# cause -> how the finding says it, for the causes that are the truth about this model and batch
BENIGN = {
    "lora_b_zero": "lora_A gradients are exactly zero because their lora_B is still zero (normal on a fresh LoRA's "
                   "first step)",
    "no_image": "vision-tower tensors were not exercised: no image batch this model accepts could be built, so the "
                "tower's gradients are not checked (pass your own batch as forward_inputs)",
    "not_read": "belong to modules whose output never reaches the loss of this batch: not exercised by this batch (a "
                "feature it does not use, such as global attention, an image-grid separator, a mask embedding or an "
                "expert the router did not pick) or a head the loss never sees; they learn only from batches that "
                "use them, and under DDP need find_unused_parameters=True",
    "selection_only": "reach the loss only through integer or boolean values (top-k / argmax indices, a comparison): "
                      "the model's own design uses them to choose, not to compute, so no gradient can reach them "
                      "(a router or indexer bias is updated outside autograd, e.g. DeepSeek-V3's "
                      "e_score_correction_bias); freeze them or update them as the model's authors do",
    "library_no_grad": "are computed without grad by the library's own modeling code (a fixed table such as "
                       "sinusoidal positions, or a value it detaches on purpose); they cannot learn — freeze them",
    "loss_independent": "get an exactly zero gradient because this batch's loss does not move with them (shifted "
                        "by 1 %, the loss stays bit-identical): their contribution is masked, overwritten or "
                        "multiplied by zero",
    "behind_zeros": "get an exactly zero gradient while all-zero tensors of this checkpoint are zero, and a nonzero "
                    "one once those are shifted: their backward works, those zeros hold it",
    "choice_only": "get an exactly zero gradient and the loss moves with them only across a discrete choice: a 1 % "
                   "shift flips which expert is picked or what a threshold masks, and a smaller shift that flips "
                   "none leaves the loss bit-identical, so it is flat between choices and zero is the true gradient "
                   "(a sparse router's gate that is exactly 1 when one expert is left, as in PhiMoE's sparsemixer)",
    "padding_row_only": "are embedding tables this batch reads only at their padding_idx row, which nn.Embedding "
                        "never updates (its gradient row is zero by contract); other ids train them",
}


def library_source(module: nn.Module | None) -> str | None:
    """The installed transformers source file that defines this module's class, as evidence of the design."""
    if module is None:
        return None
    try:
        return library_of(inspect.getsourcefile(type(module)) or "")
    except TypeError:
        return None


def cause_of_cut(site: CutSite | None) -> str:
    if site is None:
        return "cut"
    return {"library": "library_no_grad", "checkpoint": "checkpoint_cut", "code": "code_cut"}[site.kind]


_BLOCK_INDEX = re.compile(r"^(.*?)\.[^.]+\.\d+\.")


def tower_of(names: list[str]) -> str:
    """The module holding the repeated blocks these tensors sit in (`model.visual` for `model.visual.blocks.0.…`)."""
    roots = {m.group(1) if (m := _BLOCK_INDEX.match(n)) else n.rsplit(".", 1)[0] for n in names}
    return sorted(roots, key=len)[0] if roots else ""
