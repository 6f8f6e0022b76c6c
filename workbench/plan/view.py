"""How a plan is shown: the verdict against the budget, the breakdown per category with the unseen lines apart, the
moment of the peak, the top modules, the largest batch and sequence length, and the toggles."""

from __future__ import annotations

from workbench.display.nodes import Badge, Bold, Bullets, Code, Display, Heading, Inline, Paragraph, Table

GIB = 2**30


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / GIB:.2f} GiB"


def plan_view(plan) -> Display:
    d = plan.as_dict()
    s = d["setup"]
    verdict = {True: "pass", False: "fail", None: "info"}[d["fits"]]
    budget = d["budget"]
    head = Heading("Plan ", Badge(verdict), f" {s['model_type']}: {gib(d['peak_bytes'])} at the peak", level=3)
    fits = ("no budget given (--gpu NAME or --memory BYTES)" if d["fits"] is None else
            f"{'fits' if d['fits'] else 'does not fit'} {budget['name'] or ''} ({gib(budget['bytes'])})")
    what = (f"{s['setup']} set-up, batch {s['batch']} × seq {s['seq']} ({s['seq_source']}), "
            f"gradient checkpointing {'on' if s['gradient_checkpointing'] else 'off'}, optimizer {d['optimizer']}, "
            f"{'bf16' if s['bf16'] else 'fp16' if s['fp16'] else 'fp32'} autocast, {d['trainable_parameters']:,} of "
            f"{d['parameters']:,} parameters trainable, device {s['device']}"
            + (f", FSDP over {s['gpus']} GPUs: the figures are one rank's" if s["fsdp"] else
               f", {s['gpus']} GPUs (DDP)" if s["gpus"] > 1 else "")
            + (f"; the launch (processes, mixed precision, sharding) read from the accelerate config "
               f"{s['accelerate_config']}" if s.get("accelerate_config") else ""))
    rows = [[k, gib(v)] for k, v in d["breakdown"].items() if not k.startswith("unseen") and v]
    rows += [[Inline(Bold("unseen: "), t["id"]), f"{gib(t['bytes'])}"
              + (f" ({gib(t['low'])} … {gib(t['high'])})" if t.get("low") is not None else "")]
             for t in d["unseen"]]
    rows.append([Bold("planned peak"), Bold(gib(d["peak_bytes"]))])
    blocks = [head, Paragraph(fits), Paragraph(what),
              Paragraph(f"the peak is reached in: {d['phase']}; first step's peak {gib(d['first_step_peak_bytes'])}"),
              Table(["category", "bytes"], rows)]
    if d["largest_batch"] is not None or d["largest_seq"] is not None:
        blocks.append(Paragraph(f"largest batch that fits at seq {s['seq']}: {d['largest_batch']}; largest "
                                f"sequence length at batch {s['batch']}: {d['largest_seq']}"))
    if d["toggles"]:
        blocks.append(Heading("Toggles", level=4))
        blocks.append(Table(["toggle", "change", "peak", "saves", "fits"],
                            [[t["toggle"], Code(t["change"]), gib(t["peak_bytes"]), gib(t["saves_bytes"]),
                              "" if t["fits"] is None else ("yes" if t["fits"] else "no")] for t in d["toggles"]]))
    top = [m for m in d["top_modules"] if "." in m["module"]][:5]
    if top:
        blocks.append(Heading("Largest outputs", level=4))
        blocks.append(Bullets([Inline(Code(m["module"]), f" ({m['class']}): output {gib(m['output_bytes'])}")
                               for m in top]))
    terms = [Inline(Code(t["id"]), f": {t['what']} ", ", ".join(t["source"][:2]), f" ({t['read_from']})")
             for t in d["unseen"]]
    if terms:
        blocks.append(Heading("What fake tensors cannot see", level=4))
        blocks.append(Bullets(terms))
    if d["notes"]:
        blocks.append(Bullets(d["notes"]))
    return Display(*blocks)
