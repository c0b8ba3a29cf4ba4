"""Read a pytest junit XML report: how many tests passed, and why the others did not."""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.etree import ElementTree as ET


@dataclass
class TestReport:
    """Counts from one pytest run; skipped tests count neither way."""

    total: int = 0
    passed: int = 0
    failures: list[str] = field(default_factory=list)  # "test_name: message" per failed or errored test
    cases: dict[str, float] = field(default_factory=dict)  # "class::test" → 1.0 passed / 0.0 not (skipped left out)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def summary(self, limit: int = 10) -> str:
        head = f"{self.passed}/{self.total} tests passed"
        if not self.failures:
            return head
        more = f"\n... and {len(self.failures) - limit} more" if len(self.failures) > limit else ""
        return head + "\n" + "\n".join(self.failures[:limit]) + more


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_junit(xml: bytes | str) -> TestReport:
    """Count the testcases of a junit XML (pytest's `--junitxml`); raises ValueError on unreadable XML."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise ValueError(f"unreadable junit XML: {exc}") from exc
    report = TestReport()
    for case in root.iter("testcase"):
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is not None and outcome.tag == "skipped":
            continue
        report.total += 1
        name = case.get("name", "?")
        key = f"{case.get('classname')}::{name}" if case.get("classname") else name
        report.cases[key] = 1.0 if outcome is None else 0.0
        if outcome is None:
            report.passed += 1
            continue
        message = outcome.get("message") or (outcome.text or "").strip().splitlines()[-1:] or [""]
        reason = message if isinstance(message, str) else message[0]
        report.failures.append(f"{name} ({outcome.tag}): {_short(reason)}")
    return report
