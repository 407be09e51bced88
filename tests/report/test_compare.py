"""``keepsight.report.compare.compare_numbers``: what ``keepsight demo --reproduce`` prints. Every number that moved
is named with its table row, timing columns and the provenance line are left out, a removed row or a changed row's
shape counts as moved, and a row only the fresh run has is reported as added (a measure added since, not compared)."""

from keepsight.report.compare import compare_numbers


def moved_numbers(published: str, fresh: str) -> list[str]:
    return compare_numbers(published, fresh)[0]

PUBLISHED = """# keepsight demo (full profile)

Produced by `keepsight demo` from keepsight commit aaaa (source 1111); 2 threads.

## Base

| category | acc | acc+ |
| --- | --- | --- |
| colour | 0.69 | 0.44 |
| count | 0.80 | 0.65 |

| sampler | forwards | seconds | recall |
| --- | --- | --- | --- |
| plain | 32 | 4.10 | 0.153 |

The whole run took 21.5 min; recall 0.550.
"""


def test_identical_numbers_report_nothing_whatever_the_timings_and_provenance():
    fresh = (PUBLISHED.replace("aaaa (source 1111)", "bbbb (source 2222)").replace("4.10", "5.73")
             .replace("21.5 min", "23.0 min"))
    assert moved_numbers(PUBLISHED, fresh) == []


def test_a_moved_number_is_named_with_its_row():
    fresh = PUBLISHED.replace("| colour | 0.69 | 0.44 |", "| colour | 0.59 | 0.30 |").replace("recall 0.550", "recall 0.564")
    moved = moved_numbers(PUBLISHED, fresh)
    assert "Base / colour: 0.69 -> 0.59, 0.44 -> 0.30" in moved
    assert any("0.550 -> 0.564" in m for m in moved) and len(moved) == 2


def test_rows_only_on_one_side_are_reported():
    fresh = PUBLISHED.replace("| count | 0.80 | 0.65 |\n", "")
    moved = moved_numbers(PUBLISHED, fresh)
    assert moved == ["Base / count: only in the published results: | count | 0.80 | 0.65 |"]
    grown = PUBLISHED.replace("| count | 0.80 | 0.65 |\n", "| count | 0.80 | 0.65 |\n| shape | 0.77 | 0.59 |\n")
    assert compare_numbers(PUBLISHED, grown) == ([], ["Base / shape: only in the fresh run: | shape | 0.77 | 0.59 |"])


def test_a_row_that_changed_shape_counts_as_moved_not_added():
    widened = PUBLISHED.replace("| colour | 0.69 | 0.44 |", "| colour | 0.69 | 0.44 | 57 |")
    assert compare_numbers(PUBLISHED, widened) == (["Base / colour: only in the published results: | colour | 0.69 | "
                                                    "0.44 |", "Base / colour: only in the fresh run: | colour | 0.69 | "
                                                    "0.44 | 57 |"], [])


def test_a_non_timing_number_in_a_row_with_timings_still_counts():
    fresh = PUBLISHED.replace("| plain | 32 | 4.10 | 0.153 |", "| plain | 32 | 9.99 | 0.160 |")
    assert moved_numbers(PUBLISHED, fresh) == ["Base / plain: 0.153 -> 0.160"]
