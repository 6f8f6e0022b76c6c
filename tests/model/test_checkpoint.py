import json

from workbench.model.checkpoint import checkpoint_key_mapper, inspect_checkpoint, static_census
from workbench.model.components import ComponentClassifier
from workbench.model.loading import auto_config, meta_model


def test_sharded_checkpoint_is_whole(demo):
    inspection = inspect_checkpoint(demo.llama)
    finding = inspection.findings()[0]
    assert finding.verdict == "pass", finding.detail
    assert len(inspection.headers) > 1  # the demo's Llama is saved in shards
    assert inspection.bytes_read < inspection.weight_bytes / 10


def test_missing_shard_fails_naming_it(demo, copy_of):
    folder = copy_of(demo.llama)
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    shard.unlink()
    finding = inspect_checkpoint(folder).findings()[0]
    assert finding.verdict == "fail"
    assert shard.name in finding.title + finding.detail


def test_truncated_weights_fail(demo, copy_of):
    folder = copy_of(demo.qwen_base)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    finding = inspect_checkpoint(folder).findings()[0]
    assert finding.verdict == "fail" and "truncated" in finding.detail


def test_index_pointing_at_the_wrong_shard_fails(demo, copy_of):
    folder = copy_of(demo.llama)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = next(iter(index["weight_map"]))
    shards = sorted(set(index["weight_map"].values()))
    index["weight_map"][name] = next(s for s in shards if s != index["weight_map"][name])
    index_path.write_text(json.dumps(index))
    finding = inspect_checkpoint(folder).findings()[0]
    assert finding.verdict == "fail" and name in finding.detail


def test_stray_pickle_beside_safetensors_warns(demo, copy_of):
    folder = copy_of(demo.qwen_base)
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    finding = inspect_checkpoint(folder).findings()[0]
    assert finding.verdict == "warn" and "pickle" in finding.detail


def test_a_trainer_checkpoints_own_state_is_no_stray_pickle(demo, copy_of):
    folder = copy_of(demo.qwen_base)  # what Trainer._save_checkpoint writes beside the weights of checkpoint-N/
    for name in ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth", "rng_state_1.pth"):
        (folder / name).write_bytes(b"not read")
    inspection = inspect_checkpoint(folder)
    assert inspection.pickle_files == [] and inspection.findings()[0].verdict == "pass", inspection.warnings


def test_static_census_maps_legacy_keys_to_components(demo):
    # transformers 5 saves Qwen2-VL as model.layers.* / visual.*; the modules are model.language_model / model.visual
    skeleton, _ = meta_model(auto_config(demo.qwen_stage1))
    classifier = ComponentClassifier.from_model(skeleton)
    map_key, how = checkpoint_key_mapper(skeleton)
    assert map_key("model.layers.0.mlp.up_proj.weight") == "model.language_model.layers.0.mlp.up_proj.weight"
    census = static_census(inspect_checkpoint(demo.qwen_stage1), classifier.component_of, map_key, how)
    by_component = census.dtypes_by_component()
    assert set(by_component) == {"vision", "language", "head"}, by_component
    assert census.unmapped == []
    assert by_component["head"] == {"bfloat16": 1}


def test_stray_and_duplicate_weight_files_warn_through_the_probe_naming_them(demo, copy_of):
    import shutil

    import torch
    from safetensors.torch import load_file

    from workbench.model.target import resolve_target
    from workbench.probes.dtype.headers import checkpoint_probe

    def integrity(folder):
        (found,) = checkpoint_probe(resolve_target(str(folder))).findings()
        assert found.id == "checkpoint.integrity"
        return found

    assert integrity(demo.llama).verdict == "pass"  # the healthy twin: sharded, every shard indexed
    # a shard downloaded twice: the copy is in no index
    sharded = copy_of(demo.llama, "llama-duplicate")
    first = sorted(sharded.glob("model-*.safetensors"))[0]
    shutil.copy(first, sharded / f"{first.stem} (1).safetensors")
    found = integrity(sharded)
    assert found.verdict == "warn" and found.title.startswith("Checkpoint loads, with oddities"), found
    assert f"{first.stem} (1).safetensors" in found.detail and "ignored by from_pretrained" in found.detail
    assert f"Remove {first.stem} (1).safetensors from {sharded}" in found.fix
    assert "model.safetensors.index.json" in found.fix and found.evidence["warnings"] == [found.detail]
    # the pickle weights an older save left beside the safetensors ones, in the adapter's folder
    adapter = copy_of(demo.qwen_stage2, "adapter-with-bin")
    torch.save(load_file(str(adapter / "adapter_model.safetensors")), adapter / "adapter_model.bin")
    found = integrity(adapter)
    assert found.verdict == "warn" and "both safetensors and pickle weights present" in found.title, found
    assert f"Remove adapter_model.bin from {adapter}" in found.fix
    folders = found.evidence["folders"]  # the base's folder and the adapter's, each with its own files
    assert [f["kind"] for f in folders] == ["model", "adapter"]
    assert "adapter_model.bin" in folders[1]["files"] and folders[0]["warnings"] == []


def test_safetensors_under_non_standard_names_warn_and_the_fix_re_saves_them(demo, copy_of):
    folder = copy_of(demo.qwen_base, "renamed")
    (folder / "model.safetensors").rename(folder / "weights.safetensors")
    finding = inspect_checkpoint(folder).findings()[0]
    assert finding.verdict == "warn" and "non-standard names: ['weights.safetensors']" in finding.detail
    assert "Remove" not in finding.fix and f"Re-save {folder} with save_pretrained" in finding.fix
