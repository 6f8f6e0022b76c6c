"""How an explanation is shown: the symptom (message, the frame that raised it, the module it names), then the
causes ranked, each with why it fits, the checks that confirm it, the verdict of those checks when `--ckpt` ran
them, the fix and the threads. One render gives the terminal text, the HTML report and the JupyterLab view."""

from __future__ import annotations

from workbench.display.nodes import Badge, Bold, Box, Bullets, Code, Display, Heading, Inline, Link, Paragraph, Pre

CONFIRMED_BADGE = {True: "fail", False: "pass", None: "skip"}
CONFIRMED_WORD = {True: "confirmed on your model", False: "ruled out on your model", None: "not confirmed"}


def _symptom_block(expl) -> list:
    d = expl.seen.as_dict(expl.reading)
    where = [f"{k} {d[k]}" for k in ("module", "family", "library", "function") if d.get(k)]
    blocks = [Heading(Bold("Symptom: "), d["title"], f" ({d['id']})", level=3),
              Pre(d["message"] if len(d["message"]) < 2000 else d["message"][:2000] + " …")]
    facts = []
    if where:
        facts.append(Inline("raised at: ", Code(", ".join(where))))
    if d.get("script"):
        facts.append(Inline("your code: ", Code(d["script"])))
    if d.get("line"):
        facts.append(f"line {d['line']} of {expl.reading.lines} read" + (f", seen {d['times']} times"
                                                                        if d.get("times", 1) > 1 else ""))
    raised = "; ".join(f"{r['library']} {r.get('where', '')} {r.get('releases', '')}".strip()
                       for r in d["raised_by"])
    facts.append(f"raised by: {raised}")
    if expl.reading.versions:
        facts.append("versions stated: " + ", ".join(f"{k} {v}" for k, v in sorted(expl.reading.versions.items())))
    blocks.append(Bullets(facts))
    return blocks


def _cause_block(rank: int, c) -> Box:
    head = Inline(Bold(f"{rank}. "), c.cause.cause)
    if c.confirmed is not None or c.evidence:
        head = Inline(Badge(CONFIRMED_BADGE[c.confirmed]), " ", Bold(CONFIRMED_WORD[c.confirmed]), " · ", head)
    items = [Inline(Bold("why: "), "; ".join(c.why))]
    if c.cause.checks:
        items.append(Inline(Bold("checks: "), *_joined([Code(x) for x in c.cause.checks])))
    for e in c.evidence:
        items.append(Inline(Badge(e["verdict"]), f" {e['check']}: {e['title']}",
                            f" — {'confirms' if e.get('confirms') else 'does not confirm'} this cause"
                            + (f": {e['because']}" if e.get("because") else "")))
    items.append(Inline(Bold("fix: "), c.fix))
    sources = list(c.cause.sources or c.symptom.all_sources)[:3]
    if sources:
        items.append(Inline(Bold("reported: "), *_joined([Link(s, s) for s in sources])))
    colour = {True: "#c62828", False: "#2e7d32", None: "#1565c0"}[c.confirmed]
    return Box(colour, "#fafafa", Paragraph(head), Bullets(items))


def _joined(parts: list) -> list:
    out: list = []
    for i, part in enumerate(parts):
        out += [", ", part] if i else [part]
    return out


def explanation_view(expl) -> Display:
    """The view of a `ranking.Explanation`."""
    if expl.seen is None:
        near = [Inline(Code(s.id), f" — {s.title}: ", Italic_or_plain(s.message)) for s, _ in expl.nearest]
        return Display(Heading("No known symptom in this text", level=3),
                       Paragraph(f"{expl.reading.lines} lines read; none matches the {len_symptoms()} symptoms "
                                 "`workbench explain --list` shows."),
                       Paragraph("The nearest ones:") if near else None, Bullets(near) if near else None)
    blocks = _symptom_block(expl)
    if expl.confirmation:
        conf = expl.confirmation
        if conf.get("not_run"):
            blocks.append(Paragraph(f"Not confirmed on {conf['target']}: {conf['not_run']}"))
        else:
            blocks.append(Paragraph(f"Confirmed on {conf['target']}: ran {', '.join(conf['checks']) or 'no check'} "
                                    f"({conf['seconds']:.0f} s)" + (f"; report: {conf['report']}" if conf.get('report')
                                                                   else "")))
    blocks.append(Heading("Causes, most likely first", level=4))
    blocks += [_cause_block(i, c) for i, c in enumerate(expl.causes, 1)]
    if expl.reproduction:
        blocks.append(Heading("Reproduced on a tiny twin" if expl.reproduction.get("reproduced") else
                              "Reproduction on a tiny twin", level=4))
        blocks.append(Pre(expl.reproduction.get("text") or expl.reproduction.get("note", "")))
    if expl.also:
        blocks.append(Heading("Also in the text", level=4))
        blocks.append(Bullets([Inline(Code(s.symptom.id), f" ({s.symptom.kind}) ",
                                      s.hit.line[:160] if s.hit else s.symptom.title) for s in expl.also]))
    return Display(*blocks)


def Italic_or_plain(text: str):  # noqa: N802 - a node factory
    from workbench.display.nodes import Italic

    return Italic(text[:160])


def len_symptoms() -> int:
    from workbench.explain.symptoms import load_symptoms

    return len(load_symptoms())


def symptom_list_text() -> str:
    """`workbench explain --list`: every symptom, its causes and their checks."""
    from workbench.explain.symptoms import check_clue_patterns, load_symptoms

    check_clue_patterns(load_symptoms())
    lines = []
    for s in load_symptoms():
        lines.append(f"{s.id}  ({s.kind})  {s.title}")
        lines.append(f"    {s.message[:150]}")
        for c in s.causes:
            checks = f"  [{', '.join(c.checks)}]" if c.checks else ""
            lines.append(f"    - {c.id}{checks}")
    lines.append(f"{len(load_symptoms())} symptoms")
    return "\n".join(lines)
