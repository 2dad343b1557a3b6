"""Exporters' Prometheus text -> series (pure: no I/O), shared by the exporter scrapers
(producers/dcgm, producers/amd_exporter). Parsing is prometheus_client's own parser."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from gpugap.schemas.types import DeadLetterKind

#: (metric name, labels, value) of one series at the scrape's instant
Series = tuple[str, Mapping[str, str], float]


class ScrapeError(Exception):
    """A scrape that yields no valid node sample; ``kind`` is the dead-letter kind."""

    def __init__(self, kind: DeadLetterKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def check_complete(text: str) -> None:
    """Every line of the text format ends in a newline: without one the body was cut short."""
    if text and not text.endswith("\n"):
        raise ScrapeError(DeadLetterKind.MALFORMED, "scrape truncated (no final newline)")


def scrape_series(text: str, keep: Callable[[str], bool] | None = None) -> list[Series]:
    """The series of the lines ``keep`` accepts (all with None). Only the series a scraper
    uses should go through the parser: a full scrape has 3-5x more, and the parse is most of
    a round's CPU time with 100 endpoints. Raises ScrapeError (MALFORMED)."""
    if keep is not None:
        text = "".join(line for line in text.splitlines(keepends=True) if keep(line))
    try:
        return [
            (s.name, s.labels, s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except ValueError as exc:  # prometheus_client's way of saying "not the text format"
        raise ScrapeError(DeadLetterKind.MALFORMED, f"not Prometheus text format: {exc}") from None
