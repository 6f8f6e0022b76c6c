"""sweep.json's first_bad rule on verdict sequences: the first member whose verdict is fail or error right after a
member where it was not; none for a check bad from the first member on (a guess would be a false first_bad)."""

from workbench.sweep.verdicts import WARNING, first_turned


def history(*verdicts: str, check: str = "adapter.weights") -> list[dict]:
    return [{"name": f"checkpoint-{i}", "verdicts": {check: v} if v else {}} for i, v in enumerate(verdicts, 1)]


def test_the_first_member_after_a_good_one():
    assert first_turned(history("pass", "pass", "fail", "fail")) == {"adapter.weights": "checkpoint-3"}
    assert first_turned(history("skip", "error")) == {"adapter.weights": "checkpoint-2"}


def test_bad_from_the_first_member_on_has_none():
    assert first_turned(history("fail", "fail", "fail")) == {}
    assert first_turned(history("fail", "pass", "fail")) == {"adapter.weights": "checkpoint-3"}


def test_a_member_without_a_report_is_passed_over():
    assert first_turned(history("pass", None, "fail")) == {"adapter.weights": "checkpoint-3"}
    assert first_turned(history(None, "fail")) == {}


def test_the_first_turn_is_kept_when_it_turns_again():
    assert first_turned(history("pass", "fail", "pass", "fail")) == {"adapter.weights": "checkpoint-2"}


def test_warnings_count_for_the_page_only():
    assert first_turned(history("pass", "warn", "fail")) == {"adapter.weights": "checkpoint-3"}
    assert first_turned(history("pass", "warn", "fail"), WARNING) == {"adapter.weights": "checkpoint-2"}
