"""What an engine setting costs, from two bench records that differ in it alone.

Two records pair up when they measured the same workload (at the same scale) on the same shape,
dtype, commit and GPU with the same twinfer engine, and their given engine settings are the same
but for the setting, which one ran with on and the other off (the records' resolved configs say
which). Each figure of the workload then gives one cost: how much worse it is with the setting on
than the median of the records with it off (several runs of one setting: run-to-run noise is 6-10%
on the H200, so one of them alone could make the cost look smaller or larger than it is).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from reports.report.bench_records import BenchRecord, settings_flags
from reports.report.records import SettingCost
from reports.report.speed_metrics import engine_label, percent_worse, shown_value, workload_metrics

COSTED_SETTINGS = ("batch_invariant",)


def setting_costs(records: Sequence[BenchRecord]) -> list[SettingCost]:
    costs = []
    for setting in COSTED_SETTINGS:
        for on in records:
            if on.setting_in_effect(setting) is not True:
                continue
            offs = [other for other in records if _differ_only_in(setting, on, other)]
            if offs:
                costs.extend(_costs(setting, on, offs))
    return costs


def _differ_only_in(setting: str, on: BenchRecord, off: BenchRecord) -> bool:
    if off.setting_in_effect(setting) is True or off.twinfer_result is None:
        return False
    same_settings = _without(on.settings_given, setting) == _without(off.settings_given, setting)
    return same_settings and _measurement(on) == _measurement(off)


def _measurement(record: BenchRecord) -> tuple[Any, ...]:
    """What two records must share for their figures to differ by a setting alone."""
    return (
        record.workload,
        record.data["workload"].get("scale"),
        record.shape,
        record.data["dtype"],
        record.commit,
        record.gpu,
        record.twinfer_result["engine"],
    )


def _without(settings: dict[str, Any], name: str) -> dict[str, Any]:
    return {key: value for key, value in settings.items() if key != name}


def _costs(setting: str, on: BenchRecord, offs: Sequence[BenchRecord]) -> list[SettingCost]:
    costs = []
    for phase in on.twinfer_result["phases"]:
        off_metrics = [
            off_phase["metrics"]
            for off in offs
            for off_phase in off.twinfer_result["phases"]
            if off_phase["phase"] == phase["phase"]
        ]
        for metric in workload_metrics(on.workload):
            on_value = shown_value(phase["metrics"], metric)
            off_values = [value for value in (shown_value(metrics, metric) for metrics in off_metrics) if value]
            if not on_value or not off_values:
                continue
            off_value = statistics.median(off_values)
            costs.append(
                SettingCost(
                    setting=setting,
                    workload=on.workload,
                    shape=on.shape,
                    phase=phase["phase"],
                    metric=metric.title,
                    unit=metric.unit,
                    better=metric.better,
                    engine=engine_label(on.twinfer_result["engine"]),
                    settings=settings_flags(_without(on.settings_given, setting)),
                    off=off_value,
                    on=on_value,
                    cost_percent=percent_worse(on_value, off_value, metric),
                    commit=on.commit,
                    gpu=on.gpu,
                    records=tuple(record.source for record in (on, *offs) if record.source),
                )
            )
    return costs
