"""The red square a VLM's batch is built from (`multimodal_inputs.sample_image`): for a processor that keeps the
image's resolution in merged patches (Qwen2-VL's `smart_resize` and its kin), what it makes of the smallest image;
224x224 for one that resizes to its own size, and never larger than that; the demo's Qwen2-VL diagnosed on it, its
forward matrix and gradients whole."""

import pytest
import transformers

from workbench.model import multimodal_inputs as mm


@pytest.mark.parametrize("processor, side", [
    (lambda: transformers.Qwen2VLImageProcessorPil(), 56),  # its least 56 * 56 pixels
    (lambda: transformers.Glm4vImageProcessorPil(), 84),  # its least pixels count two frames of an image
    (lambda: transformers.VideoLlama3ImageProcessorPil(), 56),  # merge_size 1
    (lambda: transformers.Cosmos3EdgeImageProcessorPil(), 224),  # least 256 * 256: it enlarges 224 itself
    (lambda: transformers.SiglipImageProcessorPil(), 224),  # a fixed size: no merge_size
    (lambda: transformers.PixtralImageProcessorPil(), 224),  # keeps the resolution, but in no merged-patch grid
])
def test_the_sample_image_is_what_a_resolution_keeping_processor_makes_of_the_smallest_image(processor, side):
    processor = processor()
    image = mm.sample_image(processor)
    assert image.size == (side, side) and image.getpixel((0, 0)) == (255, 0, 0)
    if side < mm.TEST_IMAGE_SIDE:  # the processor's own answer: kept as it is, the grid of the smallest image
        grid = processor(images=[image], return_tensors="pt")["image_grid_thw"].tolist()[0]
        assert grid[1:] == [side // processor.patch_size] * 2
        one_patch = mm.sample_image(None).resize((processor.patch_size * processor.merge_size,) * 2)
        assert processor(images=[one_patch], return_tensors="pt")["image_grid_thw"].tolist()[0] == grid


def test_the_demo_vlm_is_diagnosed_on_four_image_tokens_and_every_vision_tensor_gets_a_gradient(demo):
    """The demo's Qwen2-VL (its processor's least 56 * 56 pixels): a 2x2 grid of merged patches, and still the
    image path whole: the forward matrix runs every cell on image + text, grad.flow reaches every vision tensor."""
    from workbench.model.batch import target_inputs
    from workbench.model.setups import prepare_model
    from workbench.model.target import resolve_target
    from workbench.probes.forward.grad_flow import grad_flow_probe
    from workbench.probes.forward.scenarios import forward_scenarios_probe

    target = resolve_target(str(demo.qwen_base))
    prepared = prepare_model(target)
    inputs, how = target_inputs(prepared.model, target)
    assert "a red 56x56 image" in how, how
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]] and int(inputs["mm_token_type_ids"].sum()) == 4
    matrix = forward_scenarios_probe(prepared, target)
    assert matrix.cells and all(c.ok and not c.nonfinite for c in matrix.cells), [c.as_row() for c in matrix.cells]
    flow = grad_flow_probe(prepared, target)
    vision = [r for r in flow.rows if r.component == "vision"]
    assert vision and all(r.status == "ok" for r in vision), [r.name for r in vision if r.status != "ok"]
    assert flow.findings()[0].verdict == "pass"
