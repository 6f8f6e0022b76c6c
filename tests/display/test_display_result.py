"""The result bases: findings computed once, one render for both views, a short repr, the findings table first."""

import dataclasses

from workbench.display.nodes import Display, Paragraph
from workbench.display.result import Displayable, ProbeResult
from workbench.findings import Finding


@dataclasses.dataclass(repr=False)
class CountingResult(ProbeResult):
    verdict: str
    calls: list = dataclasses.field(default_factory=list)

    def findings(self):
        self.calls.append(1)
        return [Finding("grad.flow", self.verdict, "planted", "the detail")]

    def details(self):
        return Display(Paragraph("the result's own block"))


def test_findings_are_computed_once_and_callers_get_their_own_list():
    result = CountingResult("info")
    first = result.findings()
    first.append("changed by a caller")
    assert len(result.findings()) == 1 and len(result.calls) == 1
    result._repr_mimebundle_()
    repr(result)
    assert len(result.calls) == 1
    assert len(dataclasses.replace(result, verdict="pass").findings()) == 1  # a new result computes its own


def test_one_render_gives_both_views_with_the_findings_table_first():
    result = CountingResult("fail")
    bundle = result._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"} and str(result) == bundle["text/plain"]
    text = bundle["text/plain"]
    assert text.index("FAIL") < text.index("planted") < text.index("the result's own block")
    assert bundle["text/html"].index("wb-findings") < bundle["text/html"].index("the result&#x27;s own block")


def test_recording_a_result_leaves_its_own_findings_as_they_were(tmp_path):
    from workbench.recorder import FindingsRecorder

    result = CountingResult("pass")
    recorder = FindingsRecorder(tmp_path / "f.json", notebook="04_forward_checks")
    recorder.run(lambda: result, checks=("grad.flow",))
    assert [f.notebook for f in recorder.findings] == ["04_forward_checks"]
    assert [f.notebook for f in result.findings()] == [None]  # its own table has no notebook column
    assert "04_forward_checks" not in str(result)


def test_repr_is_short_and_names_the_verdicts():
    assert repr(CountingResult("pass")) == "<CountingResult grad.flow: pass>"
    assert repr(ProbeResult()) == "<ProbeResult>"

    class Shown(Displayable):
        def view(self):
            return Display(Paragraph("a long view"), Paragraph("of two blocks"))

    assert repr(Shown()) == "<Shown>" and str(Shown()) == "a long view\n\nof two blocks"
