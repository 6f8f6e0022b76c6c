"""fp32_islands asks the model whether an off-dtype tensor reaches the activations: a traced forward (the holder,
or the module consuming a table the holder builds from positions, returns the compute dtype), a twin of the same
class that was traced, the class's own load for a tower the batch never reaches. Planted islands stay `warn`."""

import types

import torch
from torch import nn

from workbench.model.loading import default_dtype
from workbench.probes.dtype.islands import fp32_islands

BF16 = torch.bfloat16


class PositionTable(nn.Module):
    """A sinusoid-like table indexed by integer positions, computed in fp32 at construction."""

    def __init__(self, dtype: torch.dtype | None = torch.float32):  # None: the default dtype
        super().__init__()
        self.register_buffer("table", torch.randn(16, 8, dtype=dtype), persistent=False)

    def forward(self, positions):
        return self.table[positions]


class Stack(nn.Module):
    def __init__(self, cast_back: bool):
        super().__init__()
        self.positions = PositionTable()
        self.proj = nn.Linear(8, 8, dtype=BF16)
        self.cast_back = cast_back

    def forward(self, hidden):
        pos = self.positions(torch.arange(hidden.shape[1]))
        return self.proj(hidden) + (pos.to(hidden.dtype) if self.cast_back else pos)


class Toy(nn.Module):
    def __init__(self, cast_back: bool):
        super().__init__()
        self.stack = Stack(cast_back)

    def forward(self, hidden):
        return self.stack(hidden)


def _batch():
    return {"hidden": torch.randn(1, 4, 8, dtype=BF16)}


def test_a_table_whose_consumer_casts_it_back_is_contained():
    report = fp32_islands(Toy(cast_back=True), inputs=_batch())
    (island,) = report.islands
    assert island.name == "stack.positions.table" and island.intentional.startswith("contained")
    assert "`stack`, which consumes its output" in island.intentional
    assert report.findings()[0].verdict == "info"


def test_a_table_added_to_the_activations_without_a_cast_warns():
    report = fp32_islands(Toy(cast_back=False), inputs=_batch())
    assert [i.name for i in report.suspicious] == ["stack.positions.table"]
    assert report.findings()[0].verdict == "warn"


class TwoTowers(nn.Module):
    """A model with a tower the text batch never reaches, rebuilt from its config as transformers classes are."""

    table_dtype: torch.dtype | None = torch.float32

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.text = nn.Linear(8, 8)
        self.audio = nn.ModuleDict({"positions": PositionTable(self.table_dtype), "proj": nn.Linear(8, 8)})

    @classmethod
    def _from_config(cls, config, dtype=None):
        with default_dtype(dtype):
            return cls(config)

    def forward(self, hidden):
        return self.text(hidden)


def test_a_table_the_class_builds_in_fp32_in_a_tower_the_batch_never_reaches_is_the_classes_choice():
    with default_dtype(BF16):
        model = TwoTowers(types.SimpleNamespace())
    report = fp32_islands(model, inputs=_batch())
    (island,) = report.islands
    assert "built in float32 by TwoTowers itself" in island.intentional
    assert "did not reach its module" in island.intentional
    assert report.findings()[0].verdict == "info"


class TwoTowersInTheLoadDtype(TwoTowers):
    table_dtype = None  # the class builds its table in the dtype it is loaded in


def test_a_table_the_user_cast_to_fp32_in_an_unreached_tower_still_warns():
    with default_dtype(BF16):
        model = TwoTowersInTheLoadDtype(types.SimpleNamespace())
    assert model.audio["positions"].table.dtype == BF16
    model.audio["positions"].table = model.audio["positions"].table.float()
    report = fp32_islands(model, inputs=_batch())
    assert [i.name for i in report.suspicious] == ["audio.positions.table"]


def _tiny_zamba():
    from transformers import ZambaConfig, ZambaForCausalLM

    config = ZambaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=2, attention_head_dim=16, mamba_d_state=4,
                         mamba_d_conv=4, mamba_expand=2, n_mamba_heads=2, mamba_dt_rank=4, use_cache=False,
                         layers_block_type=["linear_attention", "hybrid", "hybrid"])
    torch.manual_seed(0)
    with default_dtype(BF16):
        return ZambaForCausalLM(config).eval()


def test_mamba_a_log_which_the_mixer_upcasts_on_purpose_is_contained():
    model = _tiny_zamba()
    a_logs = [n for n, p in model.named_parameters() if p.dtype == torch.float32]
    assert a_logs and all(n.endswith("A_log") for n in a_logs)  # the class builds them fp32 in a bf16 model
    report = fp32_islands(model, inputs={"input_ids": torch.randint(0, 64, (1, 8))})
    assert report.suspicious == []
    assert all("ZambaMambaMixer returned bfloat16" in i.intentional for i in report.islands)


def test_an_fp32_norm_planted_in_zamba_warns():
    model = _tiny_zamba()
    norm = model.model.final_layernorm
    norm.weight.data = norm.weight.data.float()  # ZambaRMSNorm returns weight * x: fp32 activations
    report = fp32_islands(model, inputs={"input_ids": torch.randint(0, 64, (1, 8))})
    assert "model.final_layernorm.weight" in [i.name for i in report.suspicious]
    assert report.findings()[0].verdict == "warn"


def test_xlnet_fp32_parameters_in_a_bf16_model_break_its_forward_and_warn():
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    with default_dtype(BF16):
        model = XLNetLMHeadModel(XLNetConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, d_inner=64)).eval()
    report = fp32_islands(model, inputs={"input_ids": torch.randint(0, 64, (1, 8))})
    names = {i.name for i in report.suspicious}
    assert "transformer.layer.0.rel_attn.q" in names  # einsum(bf16 hidden, fp32 q) raises without autocast
    assert report.findings()[0].verdict == "warn"


class Router(nn.Module):
    """A router the class builds in fp32 whatever the load dtype, upcasting its input (HunYuan-MoE's `wg`)."""

    def __init__(self, config, router_dtype: torch.dtype | None = torch.float32):
        super().__init__()
        self.config = config
        self.proj = nn.Linear(8, 8)
        self.wg = nn.Linear(8, 4, bias=False, dtype=router_dtype)

    @classmethod
    def _from_config(cls, config, dtype=None):
        with default_dtype(dtype):
            return cls(config, **getattr(config, "router", {}))

    def forward(self, hidden):
        weights = self.wg(hidden.to(self.wg.weight.dtype)).softmax(-1)
        return self.proj(hidden) * weights.max(-1, keepdim=True).values.to(hidden.dtype)


def test_a_parameter_the_class_builds_in_fp32_is_its_choice_when_the_forward_runs_and_a_users_cast_warns():
    with default_dtype(BF16):
        healthy = Router(types.SimpleNamespace())
        cast = Router(types.SimpleNamespace(router={"router_dtype": None}))  # the class builds it in the load dtype
    cast.wg.float()  # ... and the user cast it
    report = fp32_islands(healthy, inputs=_batch())
    (island,) = report.islands
    assert island.name == "wg.weight" and "built in float32 by Router itself" in island.intentional
    assert "forward of the diagnosis batch runs" in island.intentional and report.findings()[0].verdict == "info"
    assert [i.name for i in fp32_islands(cast, inputs=_batch()).suspicious] == ["wg.weight"]


def test_without_a_batch_a_parameter_the_class_builds_in_fp32_is_its_choice_said_untraced():
    with default_dtype(BF16):
        model = Router(types.SimpleNamespace())
    (island,) = fp32_islands(model, inputs=None).islands
    assert "built in float32 by Router itself" in island.intentional and "not traced" in island.intentional
