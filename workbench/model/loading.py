"""Loading models the way from_pretrained does: for real, or as an empty skeleton on the meta device.

Never runs remote code unless asked, never reaches the hub (the caller sets HF_HUB_OFFLINE), never unpickles:
`use_safetensors` is forced unless the caller passes `allow_pickle=True`.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from workbench.errors import UsageError
from workbench.model.bnb_cpu_layout import keep_training_layout
from workbench.model.heads import CLASSIFIER_MODULES, head_of_class

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    if name is None or isinstance(name, torch.dtype):
        return name
    if name in ("auto", ""):
        return None
    try:
        return DTYPES[str(name).removeprefix("torch.")]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}; use one of bf16, fp16, fp32 or auto") from None


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path} not found: a model checkpoint needs its config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid JSON ({exc}); re-save the checkpoint's config") from None


def auto_config(folder: str | Path, *, trust_remote_code: bool = False):
    import transformers

    raw = read_config(folder)
    model_type = raw.get("model_type")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING and not trust_remote_code:
        hint = " (it declares auto_map: custom code)" if raw.get("auto_map") else ""
        raise UsageError(
            f"{folder}/config.json: model_type {model_type!r} is unknown to transformers {transformers.__version__}"
            f"{hint}; upgrade transformers, or pass --trust-remote-code if you trust this checkpoint's code"
        )
    return transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code,
                                                   local_files_only=True)


def model_class_for(config) -> type:
    """The class from_pretrained would instantiate: the config's declared architecture, else an Auto class."""
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    sub_configs = getattr(config, "sub_configs", None) or {}
    if "vision_config" in sub_configs:
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    old = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def config_dtype(config) -> torch.dtype:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


@contextlib.contextmanager
def _values_not_drawn() -> Iterator[None]:
    """transformers' own rule for a model built on the meta device, applied where accelerate put the parameters
    there: `PreTrainedModel.init_weights` skips `initialize_weights` when the device in context is meta ("there is
    no point in trying to run inits", transformers 5.23 modeling_utils.py:3103-3106), but init_empty_weights moves
    each parameter to meta as it is registered, with no device context, so post_init would draw every weight's
    initial values on meta tensors: 0.06 s of a 0.07 s skeleton of a 26-layer Llama, paid by each skeleton a
    diagnosis builds. What init_weights does besides (tie_weights) still runs; the buffers keep the values their
    modules' __init__ gave them. Patched on the class for the block only, as init_empty_weights patches
    `nn.Module.register_parameter`: the same window, the same process-wide scope."""
    from transformers import PreTrainedModel

    drawing = PreTrainedModel.__dict__["initialize_weights"]
    PreTrainedModel.initialize_weights = lambda self: None
    try:
        yield
    finally:
        PreTrainedModel.initialize_weights = drawing


def meta_model(config, dtype: torch.dtype | None = None, quantization_config=None):
    """An empty model on the meta device, built as from_pretrained builds it (quantizer included, tied weights
    tied): no weight read.

    Returns (model, hf_quantizer or None). A 72B skeleton builds in well under a second.
    """
    from accelerate import init_empty_weights

    dtype = dtype or config_dtype(config)
    cls = model_class_for(config)
    hf_quantizer = None
    with default_dtype(dtype), init_empty_weights(), _values_not_drawn():
        model = cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)
        if quantization_config is not None:
            from transformers.quantizers import AutoHfQuantizer

            hf_quantizer = AutoHfQuantizer.from_config(quantization_config, pre_quantized=False)
            hf_quantizer.preprocess_model(model=model, dtype=dtype, device_map={"": "cpu"}, checkpoint_files=None)
    if hasattr(model, "tie_weights"):  # from_pretrained ties after loading: lm_head IS embed_tokens when tied
        model.tie_weights()
    return model, hf_quantizer


def bnb_config(quant: str, compute_dtype: torch.dtype = torch.bfloat16, model_class=None):
    """The usual QLoRA quantization: nf4 + double quant + bf16 compute for 4-bit; LLM.int8 for 8-bit. Given the model
    class, a classification head stays unquantized (it is trained: PEFT's modules_to_save), for loads and
    meta-device predictions alike."""
    config = _bnb_config(quant, compute_dtype)
    if config is not None and model_class is not None:
        if head_of_class(model_class) in ("seq_cls", "token_cls"):
            config.llm_int8_skip_modules = list(CLASSIFIER_MODULES)
    return config


def _bnb_config(quant: str, compute_dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    if quant == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=compute_dtype)
    if quant == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quant in ("none", None):
        return None
    raise UsageError(f"unknown quantization {quant!r}; use none, 4bit or 8bit")


def first_device(model) -> torch.device:
    """Where a loaded model's first real parameter lives (meta tensors of an offloaded model skipped); cpu if none.
    Inputs go there."""
    return next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))


# every full load this process made through load_pretrained: {"folder", "quant", "seconds", "why"}
LOADS: list[dict[str, Any]] = []


def load_pretrained(folder: str | Path, *, quant: str = "none", dtype: torch.dtype | None = None,
                    device_map: Any = None, max_memory: dict | None = None, trust_remote_code: bool = False,
                    allow_pickle: bool = False, attn_implementation: str | None = None,
                    why: str = "the model the set-up prepares"):
    """from_pretrained with the workbench's safety defaults (local files only, safetensors only). Each call is
    recorded in LOADS with `why` it was made (a diagnosis reports how many full loads it cost, and why each one
    beyond the set-up's could not reuse the prepared model)."""
    start = time.perf_counter()
    model = _from_pretrained(folder, quant=quant, dtype=dtype, device_map=device_map, max_memory=max_memory,
                             trust_remote_code=trust_remote_code, allow_pickle=allow_pickle,
                             attn_implementation=attn_implementation)
    if quant != "none":
        keep_training_layout(model)  # eval forwards must not repack 4-bit weights for CPU inference (bnb_cpu_layout)
    LOADS.append({"folder": str(folder), "quant": quant, "seconds": round(time.perf_counter() - start, 3),
                  "why": why})
    return model


def _from_pretrained(folder, *, quant, dtype, device_map, max_memory, trust_remote_code, allow_pickle,
                     attn_implementation):
    config = auto_config(folder, trust_remote_code=trust_remote_code)
    dtype = dtype or config_dtype(config)
    kwargs: dict[str, Any] = dict(dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code)
    if not allow_pickle:
        kwargs["use_safetensors"] = True
    cls = model_class_for(config)
    quantization_config = bnb_config(quant, compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16,
                                     model_class=cls)
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
        device_map = device_map or ({"": 0} if torch.cuda.is_available() else "cpu")
    if device_map is not None:
        kwargs["device_map"] = device_map
    if max_memory:
        kwargs["max_memory"] = max_memory
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    return cls.from_pretrained(str(folder), config=config, **kwargs)


def load_processor(folder: str | Path):
    """The processor (VLMs) or tokenizer saved beside a checkpoint, or None when there is none."""
    from transformers import AutoProcessor, AutoTokenizer

    folder = Path(folder)
    if (folder / "processor_config.json").exists() or (folder / "preprocessor_config.json").exists():
        with contextlib.suppress(Exception):
            return AutoProcessor.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    if (folder / "tokenizer_config.json").exists() or (folder / "tokenizer.json").exists():
        with contextlib.suppress(Exception):
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    return None
