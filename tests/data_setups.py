"""Set-ups that return a Trainer built on --data, each with a defect planted the way users plant it (notebook 07's
tests: `--setup data_setups:FUNCTION`; pytest puts tests/, the folder of conftest.py, on sys.path)."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile

import torch


def _output_dir(prefix: str) -> str:
    """The Trainer's output_dir (these set-ups never save into it), removed when the process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


def _rows(data):
    with open(data, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _trainer(checkpoint, tokenizer, rows, collator):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    dataset = Dataset.from_list([{"input_ids": list(tokenizer.apply_chat_template(
        r["messages"], tokenize=True, return_dict=True)["input_ids"])} for r in rows])
    args = TrainingArguments(output_dir=_output_dir("data-setup-"), report_to=[], use_cpu=True,
                             per_device_train_batch_size=4)
    return Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)


def pad_is_eos(checkpoint, data=None, **_):
    """The classic: pad = EOS, and transformers' LM collator masks every pad id, EOS included, as -100."""
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.pad_token = tokenizer.eos_token
    return _trainer(checkpoint, tokenizer, _rows(data), DataCollatorForLanguageModeling(tokenizer, mlm=False))


class CompletionOnlyCollator:
    """What trl's DataCollatorForCompletionOnlyLM did (removed from trl): mask everything up to the response
    template; a row where the template is not found is masked whole."""

    def __init__(self, tokenizer, response_template: str):
        self.tokenizer = tokenizer
        self.response = tokenizer(response_template, add_special_tokens=False)["input_ids"]

    def __call__(self, features):
        batch = self.tokenizer.pad([{"input_ids": f["input_ids"]} for f in features], return_tensors="pt")
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = -100
        n = len(self.response)
        for i, ids in enumerate(batch["input_ids"].tolist()):
            found = next((j for j in range(len(ids) - n + 1) if ids[j:j + n] == self.response), None)
            if found is None:
                labels[i, :] = -100
            else:
                labels[i, :found + n] = -100
        batch["labels"] = labels
        return batch


def response_template_never_matches(checkpoint, data=None, **_):
    """A completion-only collator looking for '### Answer:' while the chat template renders <|im_start|>assistant."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return _trainer(checkpoint, tokenizer, _rows(data), CompletionOnlyCollator(tokenizer, "### Answer:"))


def response_template_matches(checkpoint, data=None, **_):
    """The same collator with the template's own assistant header: healthy."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return _trainer(checkpoint, tokenizer, _rows(data), CompletionOnlyCollator(tokenizer, "<|im_start|>assistant\n"))


def sft_trainer(checkpoint, data=None, **_):
    """A real trl SFTTrainer on prompt/completion rows (completion-only loss, trl's collator): healthy."""
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    args = SFTConfig(output_dir=_output_dir("data-sft-"), report_to=[], use_cpu=True, bf16=False,
                     max_length=48, per_device_train_batch_size=4)
    return SFTTrainer(model=model, args=args, processing_class=tokenizer,
                      train_dataset=load_dataset("json", data_files=str(data), split="train"))


# --- checkpoints in the official Llama-3 / Gemma 3 layout: the template writes BOS and the tokenizer adds it -------
LLAMA3_TEMPLATE = (  # Meta-Llama-3-8B-Instruct's chat_template
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA3_TEMPLATE = (  # gemma-3's chat_template, text only
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n{{ message['content'] | trim }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
LAYOUTS = {  # special tokens (bos, eos, pad, then the turn markers), end of turn, how the tokenizer adds BOS
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"], "<|eot_id|>", "post_processor", LLAMA3_TEMPLATE),
    "gemma3": (["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"], "<end_of_turn>", "add_bos_token",
               GEMMA3_TEMPLATE),
}


def bos_in_template_checkpoint(folder, layout: str = "llama3"):
    """A tiny checkpoint whose chat template writes `{{ bos_token }}` while its tokenizer adds BOS too: Llama 3's
    tokenizer.json (a TemplateProcessing post-processor) or Gemma 3's tokenizer_config (`add_bos_token`)."""
    from pathlib import Path

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from workbench.demo.build import CORPUS
    from workbench.demo.chat_data import ANSWERS, QUESTIONS

    specials, end_of_turn, adds_bos, template = LAYOUTS[layout]
    bos, eos, pad = specials[:3]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS + QUESTIONS + ANSWERS, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    # Llama 3.1 Instruct ends a turn with its EOS; Gemma 3 keeps <eos> and ends turns with <end_of_turn>
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, pad_token=pad,
                                        eos_token=end_of_turn if layout == "llama3" else eos,
                                        add_bos_token=adds_bos == "add_bos_token")
    if adds_bos == "post_processor":  # set on the loaded backend, as Llama 3's tokenizer.json carries it
        tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    tokenizer.chat_template = template
    folder = Path(folder)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 bos_token_id=ids[bos], eos_token_id=ids[eos], pad_token_id=ids[pad])
                     ).save_pretrained(folder)
    GenerationConfig(bos_token_id=ids[bos], eos_token_id=[ids[eos], ids[end_of_turn]]).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
