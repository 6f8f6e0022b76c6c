import pytest

from workbench.display.text import size_text


@pytest.mark.parametrize(("size", "text"), [(0, "0 B"), (999, "999 B"), (1000, "1.00 kB"), (252_776, "252.78 kB"),
                                            (3_200_000, "3.20 MB"), (16_600_000_000, "16.60 GB")])
def test_a_size_reads_in_the_unit_that_fits(size, text):
    assert size_text(size) == text
