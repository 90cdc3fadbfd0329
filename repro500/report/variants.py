"""The report's "Training variant and sampling" section: the variant this run trained (precision,
micro-batching, parameter averaging) beside its reference's with the throughput and Valid FLOPS
ratios (verdict.json ``gains``), and each epoch's sampling (repeats/<k>/metrics.jsonl epoch
records' ``sampling``: coverage, and the drawn classes against the data set's)."""

from __future__ import annotations

from typing import Any

from repro500.report import plots
from repro500.report.html import Markup, image, num, section, status_line, subsection, table
from repro500.report.load import RunView
from repro500.report.sections import as_dict, as_list, caption, note
from repro500.verify.gains import VARIANT_KEYS, sync_text

LABELS = {"throughput_samples_per_s": "throughput (samples/s)", "valid_flops": "Valid FLOPS (FLOP/s)"}


def _variant_block(doc: dict[str, Any]) -> Markup | None:
    gains = as_dict(doc.get("gains"))
    if not gains:
        return None
    mine, theirs = as_dict(gains.get("run_variant")), as_dict(gains.get("reference_variant"))
    rows = [[key, sync_text(mine.get(key)) if key == "sync" else mine.get(key),
             sync_text(theirs.get(key)) if key == "sync" else theirs.get(key)] for key in VARIANT_KEYS]
    rows += [[LABELS.get(name, name), num(as_dict(fig).get("run")), num(as_dict(fig).get("reference"))]
             for name, fig in as_dict(gains.get("figures")).items()]
    ratios = ", ".join(f"{LABELS.get(name, name)} {num(as_dict(fig).get('ratio'), 3)}x"
                       for name, fig in as_dict(gains.get("figures")).items())
    return subsection("This run against its reference", table(["", "this run", "reference"], rows),
                      caption(f"Ratios of the means (this run / reference): {ratios}. Whether the quality is kept "
                              "is the equivalence test's decision (Verdict details)."))


def _histogram_plot(epoch: dict[str, Any]) -> str | None:
    balance = as_dict(as_dict(epoch.get("sampling")).get("balance"))
    drawn, data = as_list(balance.get("drawn_histogram")), as_list(balance.get("dataset_histogram"))
    if not drawn or len(drawn) != len(data) or not sum(data):
        return None
    total_drawn, total = sum(drawn), sum(data)
    with plots.figure_panels(1, 1, 2.6) as (fig, (ax,)):
        xs = range(len(data))
        ax.bar([x - 0.2 for x in xs], [d / total_drawn for d in drawn], width=0.4, label="drawn this epoch")
        ax.bar([x + 0.2 for x in xs], [d / total for d in data], width=0.4, label="data set")
        ax.set_xticks(list(xs))
        ax.set_xlabel("class")
        ax.set_ylabel("share of samples")
        ax.set_title(f"Classes drawn in epoch {epoch.get('epoch')} vs the data set "
                     f"(chi-square p = {num(balance.get('p_value'), 3)})")
        plots.add_legend(ax)
        return plots.to_data_uri(fig)


def _sampling_block(view: RunView, doc: dict[str, Any]) -> list[Markup]:
    verdict = as_dict(doc.get("sampling"))
    epochs = [(k, e) for k in sorted(view.records) for e in view.records[k].epochs if as_dict(e.get("sampling"))]
    if not verdict and not epochs:
        return [note("no sampling records (a command, or a run before repro500 recorded them)")]
    parts: list[Markup] = []
    if verdict:
        parts.append(status_line(verdict.get("status"), verdict.get("reason", "")))
    rows = []
    for k, e in epochs:
        s, b = as_dict(e.get("sampling")), as_dict(as_dict(e.get("sampling")).get("balance"))
        rows.append([k, e.get("epoch"), s.get("drawn"), s.get("duplicated"), s.get("missing"), s.get("expected_missing"),
                     num(b.get("chi2")), num(b.get("p_value"), 3), "yes" if b.get("biased") else "no"])
    if rows:
        parts.append(table(["repeat", "epoch", "drawn", "drawn twice or more", "never drawn", "left out by drop_last",
                            "chi-square", "p", "biased"], rows))
    if epochs:
        first = epochs[0][0]
        uri = _histogram_plot([e for k, e in epochs if k == first][-1])
        if uri:
            parts.append(image(uri, "classes drawn vs the data set"))
    parts.append(caption("Each epoch should draw every sample once (drop_last leaves out N mod (batch x ranks)) and "
                         "its classes in the data set's proportions; a biased epoch has p below 0.05 / epochs "
                         "(docs/run.md, Training variants)."))
    return parts


def variants_section(view: RunView, doc: dict[str, Any]) -> Markup:
    parts = [p for p in (_variant_block(doc),) if p is not None]
    parts.append(subsection("Sampling", *_sampling_block(view, doc)))
    return section("variants", "Training variant and sampling", *parts)
