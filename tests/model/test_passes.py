"""Full-model forwards counted for the cost block (`workbench.model.passes`): one per top-level model call, in
whichever thread, nested wrappers once, meta-device skeletons not at all."""

import threading

import pytest
import torch

from workbench.model.passes import counted_passes


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(config).eval()


def test_each_top_level_forward_counts_once_in_any_thread_and_with_autograd_apart(tiny_llama):
    from peft import LoraConfig, get_peft_model

    ids = torch.arange(8).unsqueeze(0)
    with counted_passes() as passes:
        with torch.no_grad():
            tiny_llama(input_ids=ids)                                  # its 20-odd submodules are inside it
        tiny_llama(input_ids=ids, labels=ids).loss.backward()
        worker = threading.Thread(target=lambda: tiny_llama(input_ids=ids))  # a replica thread's own forward
        worker.start()
        worker.join()
        tiny_llama.lm_head(torch.zeros(1, 16))                         # a lone submodule: no config, no pass
    assert (passes.forwards, passes.with_grad) == (3, 2)
    peft_model = get_peft_model(tiny_llama, LoraConfig(r=2, target_modules=["q_proj"]))
    with counted_passes() as passes:
        with torch.no_grad():
            peft_model(input_ids=ids)                                  # PeftModel -> LoraModel -> the model: one
    assert (passes.forwards, passes.with_grad) == (1, 0)
    peft_model.unload()


def test_a_raising_forward_leaves_the_count_right_and_the_hooks_go_with_the_block(tiny_llama):
    ids = torch.arange(8).unsqueeze(0)
    with counted_passes() as passes, torch.no_grad():
        with pytest.raises(Exception):
            tiny_llama(input_ids=ids.float())                          # raises inside the embedding
        tiny_llama(input_ids=ids)
    assert passes.forwards == 2
    with torch.no_grad():
        tiny_llama(input_ids=ids)
    assert passes.forwards == 2  # outside the block: not counted


def test_a_meta_skeleton_runs_no_pass():
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    with counted_passes() as passes, torch.no_grad():
        skeleton(input_ids=torch.arange(4, device="meta").unsqueeze(0))
    assert passes.forwards == 0


def test_a_probes_tiny_twin_runs_no_pass_and_the_model_beside_it_still_counts():
    """train.loss_accumulation's Trainer steps run on a shrunk twin of a model too big to copy: forwards over no
    weight of the model diagnosed, left out of the count (they were five 'full-model forwards' at every size)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.probes.train.loss_accumulation import tiny_twin

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                         num_attention_heads=8, num_key_value_heads=4)).eval()
    twin = tiny_twin(model)
    assert sum(p.numel() for p in twin.parameters()) < sum(p.numel() for p in model.parameters())
    ids = torch.arange(8).unsqueeze(0)
    with counted_passes() as passes:
        twin(input_ids=ids, labels=ids).loss.backward()
        with torch.no_grad():
            model(input_ids=ids)
    assert (passes.forwards, passes.with_grad) == (1, 0)


def test_a_part_of_a_model_run_alone_beside_the_whole_is_no_pass_of_its_own(family):
    """A VLM's vision tower asked alone how many image tokens an image makes (the batch builder's count, before the
    forward that accepts the batch) reads only the tower's weights: beside a forward of the whole model in the same
    block it is not another full-model forward; alone in its block, it still counts."""
    from workbench.model.setups import prepare_model
    from workbench.model.target import resolve_target

    model = prepare_model(resolve_target(str(family("llava")))).model.eval()
    tower = model.model.vision_tower
    size = model.config.vision_config.image_size
    pixels = torch.zeros(1, 3, size, size, dtype=model.dtype)
    ids = torch.arange(8).unsqueeze(0)
    with counted_passes() as passes, torch.no_grad():
        tower(pixels)
        model(input_ids=ids)
    assert (passes.forwards, passes.with_grad) == (1, 0)
    with counted_passes() as passes, torch.no_grad():
        tower(pixels)
    assert passes.forwards == 1


def test_a_model_and_the_peft_model_around_it_run_in_one_block_are_two_passes(tiny_llama):
    from peft import LoraConfig, get_peft_model

    ids = torch.arange(8).unsqueeze(0)
    peft_model = get_peft_model(tiny_llama, LoraConfig(r=2, target_modules=["q_proj"]))
    try:
        with counted_passes() as passes, torch.no_grad():
            peft_model(input_ids=ids)
            peft_model.get_base_model()(input_ids=ids)                 # the same weights read again
        assert passes.forwards == 2
    finally:
        peft_model.unload()


def test_the_cost_block_reads_a_steps_forwards_once_the_part_run_beside_the_whole_is_dropped(family, tmp_path):
    """The recorder writes each step's forwards as its block ends, after the tower's count beside the whole
    model's forward is dropped: notebook 01's islands step of a VLM without a processor said 2."""
    from workbench.model.setups import prepare_model
    from workbench.model.target import resolve_target
    from workbench.recorder import FindingsRecorder

    model = prepare_model(resolve_target(str(family("llava")))).model.eval()
    size = model.config.vision_config.image_size

    def count_then_accept():
        with torch.no_grad():
            model.model.vision_tower(torch.zeros(1, 3, size, size, dtype=model.dtype))
            model(input_ids=torch.arange(8).unsqueeze(0))

    recorder = FindingsRecorder(tmp_path / "findings.json", notebook="01_dtype_distribution")
    recorder.run(count_then_accept, step="islands")
    assert (recorder.step_seconds["islands"]["forwards"], recorder.step_seconds["islands"]["forwards_with_grad"]) \
        == (1, 0), recorder.step_seconds["islands"]
