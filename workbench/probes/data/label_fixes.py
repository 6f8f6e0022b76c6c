"""What `data.labels` tells the user to do, in their terms: the cause of rows whose masking supervises nothing, and
the fix for those and for blank answers (their file, their field, a `dataset.filter` that keeps the good rows)."""

from __future__ import annotations

from workbench.probes.data.batches import DataBatches


def masking_cause(path: DataBatches) -> str:
    if path.how == "trainer":
        return (f"{path.collator_name[0].upper()}{path.collator_name[1:]} produced these labels: typically a response "
                "template it never finds in the tokenized rows (the chat template renders the assistant header "
                "differently, or tokens merge across it), so it masks the whole row.")
    return f"trl built these labels ({path.masking}): the rows have no answer tokens to supervise."


def blank_fix(path: DataBatches, blank) -> str:
    """Filter the blank rows (`blank`: their stats Category), in the user's own file and field."""
    source = path.source
    name = source.path.name if source is not None else "your dataset"
    rows = f" (rows {blank.named()})" if blank.count else ""
    fmt, conversational = (source.format, source.conversational) if source is not None else (None, False)
    if fmt in ("messages", "prompt-completion") and (conversational or fmt == "messages"):
        field = "messages" if fmt == "messages" else "completion"
        what = f"assistant `content` in `{field}`"
        keep = f"any(m['content'].strip() for m in row['{field}'] if m['role'] == 'assistant')"
    elif fmt in ("prompt-completion", "text"):
        field = "completion" if fmt == "prompt-completion" else "text"
        what, keep = f"`{field}`", f"row['{field}'].strip()"
    else:
        return (f"Drop the rows of {name} whose labels supervise only the end-of-turn token{rows}, or give them "
                "their answer tokens.")
    return (f"Write the answer, or drop the rows of {name} whose {what} is blank{rows}: "
            f"`dataset = dataset.filter(lambda row: {keep})` before training.")


def labels_fix(path: DataBatches) -> str:
    if path.how == "trainer":
        return ("Make the collator's response template match what the chat template renders, as token ids "
                "(tokenize the rendered assistant header, e.g. tokenizer.apply_chat_template(..., "
                "add_generation_prompt=True) minus the prompt), or let trl build the labels: prompt/completion rows "
                "with completion_only_loss=True, or messages with assistant_only_loss=True.")
    return "Give every row a non-empty answer (assistant message or completion), or drop those rows."
