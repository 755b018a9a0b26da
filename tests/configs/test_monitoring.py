"""The monitoring assets in configs/monitoring/: every query names a metric the server
exports, the alerting rules pass promtool's check and their own unit tests, and the
collapse alert's threshold is the watch's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from serving.hardware import hardware_target
from serving.paths import PROJECT_ROOT
from serving.server.metrics import ServerMetrics
from tasks.loop.retrain_config import load_retrain_config

MONITORING = PROJECT_ROOT / "configs" / "monitoring"
RULES = MONITORING / "prometheus-rules.yml"
RULE_TESTS = MONITORING / "prometheus-rules-test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
# A metric name in a query: the server's own (specops:...) and the process collector's.
METRIC = re.compile(r"\b(?:specops:[a-z0-9_]+|process_[a-z0-9_]+)")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def exported_names() -> set[str]:
    """Every sample name a server's /metrics can carry (labelled metrics included before
    their first observation)."""
    metrics = ServerMetrics(model_name="m", hardware=hardware_target("cpu"))
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def dashboard_queries() -> dict[str, list[str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [*dashboard["panels"]]
    for panel in dashboard["panels"]:
        panels += panel.get("panels", [])  # inside collapsed rows
    queries = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in panels}
    variables = [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {**queries, "template variables": variables}


def rule_queries() -> dict[str, list[str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: [rule["expr"]] for group in groups for rule in group["rules"]}


@pytest.mark.parametrize("source", [dashboard_queries, rule_queries])
def test_every_query_names_only_metrics_the_server_exports(source):
    exported = exported_names()
    assert "specops:champion_evaluated_acceptance_rate" in exported
    for title, queries in source().items():
        assert queries, f"{title!r} has no query"
        for query in queries:
            named = set(METRIC.findall(query))
            assert named, f"{title!r}: {query!r} names no specops metric"
            assert named <= exported, f"{title!r} names {sorted(named - exported)}"


def test_the_collapse_alert_fires_below_the_watchs_share():
    (expr,) = rule_queries()["SpecOpsChampionAcceptanceCollapsed"]
    (share,) = re.findall(r"\(([0-9.]+) \* max by", expr)
    assert float(share) == load_retrain_config().watch.share


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    if os.environ.get("SPECOPS_REQUIRE_PROMTOOL") == "1":  # scripts/test.sh installs it
        pytest.fail("promtool is missing: apt-get install --no-install-recommends prometheus")
    pytest.skip("promtool is not installed (Debian's prometheus package has it)")


@pytest.mark.parametrize(
    "command", [["check", "rules", RULES.name], ["test", "rules", RULE_TESTS.name]]
)
def test_the_rules_pass_promtool(command):
    done = subprocess.run(
        [promtool(), *command], cwd=MONITORING, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_wrong_threshold_fails_the_rule_tests(tmp_path: Path):
    """The rule tests can fail: with the collapse threshold at a tenth, they do."""
    for source in (RULES, RULE_TESTS):
        shutil.copy(source, tmp_path / source.name)
    rules = tmp_path / RULES.name
    rules.write_text(rules.read_text().replace("(0.5 * max by", "(0.05 * max by"))
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "SpecOpsChampionAcceptanceCollapsed" in done.stdout + done.stderr
