"""The symptom data: loaded and validated like the catalog, every message recognised as itself and nothing else,
the gate that keeps a 100 MB log fast never dropping a match."""

import re

import pytest

from workbench.catalog import CHECK_IDS
from workbench.explain.metrics import LOG_CONDITIONS
from workbench.explain.reading import _literal, read_text
from workbench.explain.symptoms import SymptomDataError, check_clue_patterns, load_symptoms


def test_at_least_forty_symptoms_each_with_causes_checks_from_the_catalog_and_cited_threads():
    symptoms = load_symptoms()
    check_clue_patterns(symptoms)  # every clue regex compiles, every version requirement parses
    assert len(symptoms) >= 40
    assert len({s.id for s in symptoms}) == len(symptoms)
    for s in symptoms:
        assert s.causes and all(c.fix and c.cause for c in s.causes)
        assert all(url.startswith("https://") for url in s.all_sources), s.id
        assert all(check in CHECK_IDS for c in s.causes for check in c.checks)
        assert all(set(c.confirms) <= {"fail", "warn", "info"} for c in s.causes)
    areas = {s.id.split(".")[0] for s in symptoms}
    assert {"dtype", "precision", "grad", "distributed", "placement", "peft", "data", "generation", "logs"} <= areas


@pytest.mark.parametrize("symptom", load_symptoms(), ids=lambda s: s.id)
def test_each_message_is_recognised_as_its_own_symptom_and_no_other(symptom):
    reading = read_text(symptom.message, load_symptoms())
    hits = [h.symptom_id for h in reading.hits]
    if symptom.kind == "log" and symptom.when:
        assert reading.metrics.holds(symptom.when), symptom.message
        assert all(load_symptoms()[[s.id for s in load_symptoms()].index(h)].kind == "log" for h in hits)
    else:
        assert hits == [symptom.id]


@pytest.mark.parametrize("symptom", load_symptoms(), ids=lambda s: s.id)
def test_the_gate_literal_of_every_pattern_is_in_what_it_matches(symptom):
    for regex in symptom.regexes:
        m = regex.search(symptom.message)
        if m:
            assert _literal(regex.pattern) in m.group(0).lower(), regex.pattern


def test_gate_literals_skip_optional_and_alternative_parts():
    assert _literal(r"expected mat1 and mat2 to have the same dtype, but got:? (?P<a>\w+)") == \
        "expected mat1 and mat2 to have the same dtype, but got"
    assert _literal(r"(?:mat1|self) and mat2 must have the same dtype(?:, but got (\w+))?") == \
        " and mat2 must have the same dtype"
    assert _literal(r"foo|bar baz qux") == ""  # a top-level alternation: no single literal is required
    assert _literal(r"Input type \(torch\.\w+\) and") == "input type (torch."
    for pattern, text in ((r"colou?r of the tensors", "color of the tensors"), (r"ab[cd]+ efgh ijk", "abdd efgh ijk")):
        assert _literal(pattern) in text and re.search(pattern, text)


def _write(tmp_path, text):
    (tmp_path / "bad.yaml").write_text(text)
    return tmp_path


ENTRY = """
- id: x.y
  title: t
  kind: error
  message: "boom happened here"
  patterns: ['boom happened']
  raised_by: [{library: torch}]
  causes:
    - {id: c, cause: because, prior: 1.0, checks: CHECKS, CONFIRMS fix: "do {module}", sources: [https://e.org/1]}
"""


@pytest.mark.parametrize("checks,confirms,why", [
    ("[no.such_check]", "", "not in the catalog"),
    ("[grad.flow]", "confirms: [skip],", "only fail, warn, info confirm"),
    ("[grad.flow]", "confirms: [pass],", "only fail, warn, info confirm"),
    ("[grad.flow]", "confirms_if: {data.eos: 'x'},", "not among its checks"),
])
def test_a_cause_naming_an_unknown_check_or_confirming_on_a_healthy_answer_is_refused(tmp_path, checks, confirms, why):
    folder = _write(tmp_path, ENTRY.replace("CHECKS", checks).replace("CONFIRMS", confirms))
    with pytest.raises(SymptomDataError, match=why):
        load_symptoms.__wrapped__(folder)


def test_the_schema_refuses_unmatched_messages_unknown_fix_fields_and_missing_sources(tmp_path):
    good = ENTRY.replace("CHECKS", "[grad.flow]").replace("CONFIRMS", "")
    assert load_symptoms.__wrapped__(_write(tmp_path, good))[0].causes[0].checks == ("grad.flow",)
    for bad, why in ((good.replace("boom happened here", "nothing alike"), "no pattern matches"),
                     (good.replace("{module}", "{model_name}"), "fix names"),
                     (good.replace("sources: [https://e.org/1]", "sources: []"), "sources"),
                     (good.replace("kind: error", "kind: crash"), "kind")):
        with pytest.raises(SymptomDataError, match=why):
            load_symptoms.__wrapped__(_write(tmp_path, bad))
    clued = good.replace("checks: [grad.flow],", "checks: [grad.flow], clues: [{in: code, pattern: 'a(b', weight: 1, "
                                                "says: s}],")
    with pytest.raises(SymptomDataError, match="code clue 'a\\(b'"):
        check_clue_patterns(load_symptoms.__wrapped__(_write(tmp_path, clued)))


def test_log_conditions_named_by_the_data_exist():
    for s in load_symptoms():
        assert s.when is None or s.when in LOG_CONDITIONS
        for c in s.causes:
            assert all(clue.pattern in LOG_CONDITIONS for clue in c.clues if clue.place == "metrics")


def test_every_cause_and_fix_fills_from_an_empty_reading_without_a_leftover_field():
    from workbench.explain.ranking import FIELD, fill_fix

    for s in load_symptoms():
        for c in s.causes:
            for text in (c.fix, c.cause):
                filled = fill_fix(text, {})
                assert not FIELD.search(filled), (s.id, c.id)
                assert fill_fix(text, {"module": "lm_head"}) == filled.replace("<module>", "lm_head")
