"""Write docs/grafana/anarchon-dashboard.json, the Grafana dashboard of celery_anarchon's metrics,
with Grafana's own grafana-foundation-sdk (the ``docs`` extra):

    python docs/grafana/make_dashboard.py            # rewrites the JSON
    python docs/grafana/make_dashboard.py --check    # exit 1 when the JSON is not what it makes

Every query names series beat's and the worker's exporters serve (tests/beat/test_alert_rules.py
checks it, and that the committed JSON is what this script makes). The ``datasource`` variable
picks the Prometheus data source; ``job`` the beat job (``anarchon-beat`` in docs/production.md's
scrape configuration).
"""
from __future__ import annotations

import json
import pathlib
import sys

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as kinds
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUT = pathlib.Path(__file__).with_name("anarchon-dashboard.json")
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
JOB = 'job=~"$job"'

#: (title, unit, [(PromQL, legend)]) of the stat panels: the state of the cluster now
STATS = [
    ("Live instances", "short", [(f"max(anarchon_live_instances{{{JOB}}})", "live")]),
    ("Beats scraped", "short", [(f"count(anarchon_last_tick_timestamp_seconds{{{JOB}}})",
                                 "scraped")]),
    ("Store up", "short", [(f"min(anarchon_store_up{{{JOB}}})", "store up")]),
    ("Overdue entries", "short", [(
        f"count((max by (entry) (anarchon_last_slot_timestamp_seconds{{{JOB}}}) > "
        f"max by (entry) (anarchon_last_run_timestamp_seconds{{{JOB}}})) "
        f"and on (entry) (time() - max by (entry) "
        f"(anarchon_last_slot_timestamp_seconds{{{JOB}}}) > 120)) or vector(0)", "overdue")]),
]
#: (title, unit, [(PromQL, legend)]) of the time series panels
SERIES = [
    ("Runs sent and claims lost to another instance", "ops", [
        (f'sum(rate(anarchon_claims_total{{{JOB},outcome="won"}}[5m]))', "won (sent)"),
        (f'sum(rate(anarchon_claims_total{{{JOB},outcome="other_won"}}[5m]))', "other_won"),
        (f"sum(rate(anarchon_sends_total{{{JOB}}}[5m]))", "sends (every attempt)")]),
    ("Skipped claims by outcome", "short", [
        (f'sum by (outcome) (increase(anarchon_claims_total{{{JOB},'
         f'outcome!~"won|other_won"}}[5m]))', "{{outcome}}")]),
    ("Send failures by entry", "short", [
        (f"sum by (entry) (increase(anarchon_send_failures_total{{{JOB}}}[5m])) > 0",
         "{{entry}}")]),
    ("Missed runs by entry (slots no instance claimed in time)", "short", [
        (f"sum by (entry) (increase(anarchon_missed_runs_total{{{JOB}}}[5m])) > 0",
         "{{entry}}")]),
    ("Seconds since each entry's last run", "s", [
        (f"time() - max by (entry) (anarchon_last_run_timestamp_seconds{{{JOB}}})",
         "{{entry}}")]),
    ("Seconds to each entry's next slot", "s", [
        (f"min by (entry) (anarchon_next_slot_timestamp_seconds{{{JOB}}}) - time()",
         "{{entry}}")]),
    ("Lateness at send (p50, p99)", "s", [
        (f"histogram_quantile({q}, sum by (le) "
         f"(rate(anarchon_lateness_seconds_bucket{{{JOB}}}[5m])))", f"p{int(q * 100)}")
        for q in (0.5, 0.99)]),
    ("Store round trip, p99", "s", [
        (f"histogram_quantile(0.99, sum by (le, operation) "
         f"(rate(anarchon_store_round_trip_seconds_bucket{{{JOB}}}[5m])))", "{{operation}}")]),
    ("Lease events", "short", [
        (f"sum by (event) (increase(anarchon_leases_total{{{JOB}}}[5m]))", "beat {{event}}"),
        ("sum by (event) (increase(anarchon_worker_leases_total[5m]))", "worker {{event}}")]),
]


def queries(targets: list[tuple[str, str]]) -> list[prometheus.Dataquery]:
    return [prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i))
            for i, (expr, legend) in enumerate(targets)]


def build() -> dict:
    """The dashboard as Grafana's JSON model (a dict)."""
    board = (dashboard.Dashboard("celery_anarchon").uid("celery-anarchon")
             .tags(["celery", "celery_anarchon"]).refresh("30s").time("now-6h", "now")
             .timezone("browser")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Data source")
                            .type("prometheus"))
             .with_variable(dashboard.QueryVariable("job").label("Job").datasource(DATASOURCE)
                            .query("label_values(anarchon_last_tick_timestamp_seconds, job)")
                            .include_all(True).multi(True))
             .with_row(dashboard.Row("Now")))
    for title, unit, targets in STATS:
        panel = (stat.Panel().title(title).unit(unit).datasource(DATASOURCE).span(6).height(4)
                 .graph_mode(kinds.BigValueGraphMode.AREA)
                 .color_mode(kinds.BigValueColorMode.VALUE)
                 .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"])))
        for query in queries(targets):
            panel = panel.with_target(query)
        board = board.with_panel(panel)
    board = board.with_row(dashboard.Row("Over time"))
    for title, unit, targets in SERIES:
        panel = (timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).span(12)
                 .height(8)
                 .tooltip(common.VizTooltipOptions().mode(kinds.TooltipDisplayMode.MULTI)
                          .sort(kinds.SortOrder.DESCENDING))
                 .legend(common.VizLegendOptions().display_mode(kinds.LegendDisplayMode.LIST)
                         .placement(kinds.LegendPlacement.BOTTOM).show_legend(True)))
        for query in queries(targets):
            panel = panel.with_target(query)
        board = board.with_panel(panel)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    """The dashboard's JSON text, as committed."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is not what {__file__} makes: run it", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
